"""A Gemma 2 model (random weights: windows, soft-caps, four norms) behind the gateway as a
user runs it: its own kind of chat template (no system role), the disk tier, two tenants,
Anthropic breakpoints and OpenAI structured output, through the official SDKs over loopback.

- the system prompt (several windows long) is cached at its breakpoint and read back by the
  same tenant, not by the other one;
- after the memory is flooded, the prefix comes back from the disk tier and the greedy answer
  is the one computed before;
- a JSON-schema answer validates; blocks are conserved at the end;
- the window layers keep their K/V in a pool of their own (``window_ratio`` 0.9), which
  ``/v1/cache/stats`` shows beside the main pool, to the admin with its counts."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from radixgate.runtime.model.loader import load_model
from tests.support.engine import integrity
from tests.support.inproc import engine_of, in_process_gateway
from tests.support.server import tenant_key
from tests.test_loader_hf import write_model_dir
from tests.test_render import NO_SYSTEM_TEMPLATE
from tests.test_structured_api import WEATHER

pytest.importorskip("transformers")

SYSTEM = "You answer questions about the radix tree cache and paged attention. " * 4
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma2")
    write_model_dir(path, "gemma2")
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = NO_SYSTEM_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return load_model(str(path), device="cpu", weights_dtype="float32", max_model_len=1024)


def client(base_url: str, tenant: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=tenant_key(tenant),
                                    max_retries=0, timeout=120)


async def ask(base_url: str, tenant: str, question: str):
    return await client(base_url, tenant).messages.create(
        model="claude-test", max_tokens=6, extra_body=GREEDY,
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": question}])


async def test_gemma2_with_tier_tenants_breakpoints_and_structured_output(gemma, tmp_path):
    async with in_process_gateway(tenants=("acme", "beta"), kv_cache_gb=0.00019,
                                  max_model_len=512, model=gemma,
                                  cache={"disk": {"dir": str(tmp_path / "kv"), "gb": 0.05},
                                         "window_ratio": 0.9}
                                  ) as (base_url, app):
        engine = engine_of(app)
        assert engine.core.kv.window is not None
        first = await ask(base_url, "acme", "What is a block?")
        assert first.usage.cache_creation_input_tokens > 32          # the system prompt, pinned
        again = await ask(base_url, "acme", "What is a block?")
        assert again.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens
        assert again.content[0].text == first.content[0].text
        other = await ask(base_url, "beta", "What is a block?")
        assert other.usage.cache_read_input_tokens == 0                 # another tenant's cache

        acme, beta = (openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=tenant_key(t),
                                         max_retries=0, timeout=120) for t in ("acme", "beta"))
        long_prompt = [{"role": "user", "content": "Explain the eviction order. " * 25}]
        before = await acme.chat.completions.create(model="gpt-4o-mini", max_tokens=6,
                                                    temperature=0.0, messages=long_prompt)
        fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER,
                                                      "strict": True}}
        for k in range(6):                     # beta fills the memory: acme's prompt leaves
            done = await beta.chat.completions.create(
                model="gpt-4o-mini", max_tokens=60, response_format=fmt, temperature=0.0,
                messages=[{"role": "user", "content": f"Weather report {k}: " + "sunny " * 60}])
            jsonschema.validate(json.loads(done.choices[0].message.content), WEATHER)
        after = await acme.chat.completions.create(model="gpt-4o-mini", max_tokens=6,
                                                   temperature=0.0, messages=long_prompt)
        tier = engine.request_snapshot().result(timeout=30).tier
        assert tier.writes > 0 and tier.hit_tokens > 0                 # back from the disk
        assert after.usage.prompt_tokens_details.cached_tokens > 0
        assert after.choices[0].message.content == before.choices[0].message.content
        integrity(engine)
        await check_pools(base_url)


async def check_pools(base_url: str) -> None:
    import aiohttp

    from tests.support import client as c
    from tests.support.server import ADMIN_KEY
    async with aiohttp.ClientSession(base_url) as http:
        _, admin = await c.get_json(http, base_url + "/v1/cache/stats", ADMIN_KEY)
        _, mine = await c.get_json(http, base_url + "/v1/cache/stats", tenant_key("acme"))
    main, window = admin["pools"]["main"], admin["pools"]["window"]
    assert window["layers"] == [0] and window["window"] == 8
    assert 0 < window["blocks"] < main["blocks"] and window["bytes_per_token"] > 0
    assert window["cached"] > 0 and window["free"] <= window["blocks"]
    assert admin["capacity"]["bytes"] == (main["blocks"] * main["bytes_per_token"]
                                          + (window["blocks"] + 1) * window["bytes_per_token"]
                                          ) * admin["block_size"]          # + the trash block
    assert mine["pools"]["window"]["cached"] == 0                   # server-wide: admin only
