"""radixgate.gateway: the HTTP side (aiohttp) and the ``radixgate`` CLI. Never imports torch.

app.create_app(config) builds the server; cli.main is the console script. Rooms:
config (TOML + flags), auth (keys -> tenants, namespaces, rate limits), errors (envelopes),
schemas_* (pydantic request models), convert_* + render + tools (request -> token ids with
breakpoints; docs/PROMPT_FORMAT.md), anthropic_api / openai_api (routes), service (one
generation: submit, abort on disconnect, book usage), admin (health, metrics, stats, cache
administration), cache_stats + usage_book + metrics (what tenants and operators see),
openapi (/openapi.json), dashboard + static (the live page).
"""
