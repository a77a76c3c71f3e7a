"""radixgate.gateway: the HTTP side (aiohttp) and the ``radixgate`` CLI. Never imports torch.

One package per API, each converting only its own wire format: ``anthropic/`` (Messages),
``openai/`` (chat, completions, models, ``responses/``), ``vllm/`` (tokenize, detokenize).
What they share: ``pipeline`` (a converted request -> engine requests -> ``Generation``s:
constraint, render, answer room, sampling, submit, abort on disconnect, usage booked),
``streaming`` (the way in and the streamed answer's skeleton), ``output`` (the answer's
text and tool calls), render + prompt_parts + tools (token ids with breakpoints;
docs/PROMPT_FORMAT.md), constraints + constraint_fields (grammars from request fields).
The server shell: app (assembly, lifecycle), middleware (ids, auth, CORS, error envelopes,
access log), state (config, keys, the engine), config, auth, errors, cli, scaleout (the
engine on Ray Serve). Operations: admin (health, metrics, stats, cache administration),
cache_stats + usage_book + metrics, openapi (/openapi.json), dashboard + static.
"""
