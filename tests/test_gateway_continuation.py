"""A response that ends in a tool call tells the cache to expect the conversation back
(``RadixTree.expect_continuation``); a text answer does not. In-process app, real tiny
engine. The tiny model's random output is never a valid call, so the positive case
replaces the output parser's verdict (the parser has its own tests in test_gateway_tools)."""
from __future__ import annotations

import asyncio

from radixgate.gateway import output
from radixgate.gateway.auth import namespace_for
from radixgate.gateway.http_util import STATE
from radixgate.gateway.tools import split_output
from tests.test_gateway_app import start, wait_ready

HEADERS = {"x-api-key": "sk-solo", "anthropic-version": "2023-06-01"}
TOOL = {"name": "search", "description": "Search the web.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}
CALL = '<tool_call>{"name": "search", "arguments": {"q": "radix trees"}}</tool_call>'


def body(prefill: str, stream: bool) -> dict:
    return {"model": "claude-3-x", "max_tokens": 2, "temperature": 0, "stream": stream,
            "tools": [TOOL],
            "messages": [{"role": "user", "content": "Find out what a radix tree is."},
                         {"role": "assistant", "content": prefill}]}


async def expected_nodes(client) -> int:
    """Nodes of the tenant's namespace that carry a continuation credit (read once the
    engine has applied every earlier command)."""
    engine = client.app[STATE].engine
    await asyncio.wrap_future(engine.check_integrity())
    ns = engine.core.tree.namespace(namespace_for("solo"))
    stack, marked = list(ns.root.children.values()), 0
    while stack:
        node = stack.pop()
        marked += node.policy_state is not None and node.policy_state.expected_access > 0
        stack.extend(node.children.values())
    return marked


async def test_tool_use_response_marks_the_conversation_for_continuation(aiohttp_client,
                                                                         monkeypatch):
    items = split_output("Sure. " + CALL, ("search",), "toolu_")
    monkeypatch.setattr(output, "split_output", lambda *args: items)
    client = await start(aiohttp_client)
    await wait_ready(client)
    response = await client.post("/v1/messages", json=body("Sure.", False), headers=HEADERS)
    assert response.status == 200
    assert (await response.json())["stop_reason"] == "tool_use"
    assert await expected_nodes(client) >= 1
    metrics = await (await client.get("/metrics", headers=HEADERS)).text()
    assert 'radixgate_expected_continuations_total{tenant="solo"} 1.0' in metrics


async def test_text_response_marks_nothing(aiohttp_client):
    client = await start(aiohttp_client)
    await wait_ready(client)
    response = await client.post("/v1/messages", json=body("A radix tree is", False),
                                 headers=HEADERS)
    assert response.status == 200
    assert (await response.json())["stop_reason"] != "tool_use"
    assert await expected_nodes(client) == 0
    metrics = await (await client.get("/metrics", headers=HEADERS)).text()
    assert 'radixgate_expected_continuations_total{tenant="solo"}' not in metrics
