"""The client libraries people build agents with, unchanged, against one server on the
default model (SmolLM2-135M) over loopback: pydantic-ai (OpenAI and Anthropic providers),
the OpenAI Agents SDK (Responses and chat completions models), LangChain (ChatAnthropic,
ChatOpenAI), instructor (tools and JSON-schema modes) and LiteLLM (OpenAI and Anthropic
routes). Each test asserts what a user of that library sees: a validated pydantic object,
a tool that ran, cache reads reported in the library's own usage type.

A 135M model answers poorly; the tests check the contract (the object validates, the tool
ran with arguments of its schema, the cached tokens are counted), not the facts."""
from __future__ import annotations

import asyncio
import os

import pytest
from pydantic import BaseModel

from tests.support.server import ServerSpec, shared_server, tenant_key

pytestmark = pytest.mark.realmodel

TENANT = "agents"
SPEC = ServerSpec(tiny=False, kv_cache_gb=0.5, max_model_len=4096, tenants=(TENANT,),
                  max_pinned_tokens=4000, request_timeout_s=300)
# a shared system prompt long enough to span several KV blocks (about 200 tokens)
SYSTEM = ("You are the city desk of an atlas. Answer with the city and its country. " +
          " ".join(f"Entry {i}: the city number {i} lies on river {i * 7} in region {i * 3}."
                   for i in range(16)))
QUESTION = "Which city is the capital of France?"


# greedy, with a budget the answer fits: at the default temperature the 135M model now and
# then writes a string until max_tokens (4,096 by default in pydantic-ai) and the agent retries
CHEAP = {"max_tokens": 128, "temperature": 0.0}


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


@pytest.fixture(scope="module")
def api_key() -> str:
    return tenant_key(TENANT)


@pytest.fixture(autouse=True, scope="module")
def _quiet_libraries():
    """No tracing or telemetry calls out of the machine (the Agents SDK, LiteLLM)."""
    saved = {k: os.environ.get(k) for k in ("OPENAI_AGENTS_DISABLE_TRACING",
                                            "LITELLM_LOCAL_MODEL_COST_MAP")}
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# -- pydantic-ai --------------------------------------------------------------------------

def test_pydantic_ai_agent_gives_a_validated_object_over_openai(server, api_key):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(
        base_url=server.base_url + "/v1", api_key=api_key))
    result = Agent(model, output_type=City, system_prompt=SYSTEM,
                   model_settings=CHEAP).run_sync(QUESTION)
    assert isinstance(result.output, City)
    assert result.output.name and result.output.country


def test_pydantic_ai_agent_gives_a_validated_object_over_anthropic(server, api_key):
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    model = AnthropicModel("claude-sonnet-4", provider=AnthropicProvider(
        base_url=server.base_url, api_key=api_key))
    # pydantic-ai drops temperature for Anthropic's newest API version unless told the older one
    settings = {**CHEAP, "extra_headers": {"anthropic-version": "2023-06-01"}}
    result = Agent(model, output_type=City, system_prompt=SYSTEM,
                   model_settings=settings).run_sync(QUESTION)
    assert isinstance(result.output, City)
    assert result.output.name and result.output.country


# -- OpenAI Agents SDK ----------------------------------------------------------------------

def _agents_run(server, api_key, model_kind: str):
    """An agent whose one function tool must be called (tool_choice required, one call at a
    time) and whose final output is that tool's result; returns (final_output, the tool's
    calls)."""
    import agents
    from openai import AsyncOpenAI

    calls: list[tuple[str, str]] = []

    @agents.function_tool
    def record_city(name: str, country: str) -> str:
        """Record a city and its country in the atlas."""
        calls.append((name, country))
        return f"recorded {name}"

    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key=api_key, max_retries=0)
    model = (agents.OpenAIResponsesModel("gpt-4o-mini", client) if model_kind == "responses"
             else agents.OpenAIChatCompletionsModel("gpt-4o-mini", client))
    agent = agents.Agent(name="atlas", instructions=SYSTEM, model=model, tools=[record_city],
                         model_settings=agents.ModelSettings(tool_choice="required",
                                                             parallel_tool_calls=False,
                                                             max_tokens=64, temperature=0.0),
                         tool_use_behavior="stop_on_first_tool")
    result = agents.Runner.run_sync(agent, QUESTION,
                                    run_config=agents.RunConfig(tracing_disabled=True))
    return result.final_output, calls


@pytest.mark.parametrize("model_kind", ["responses", "chat_completions"])
def test_openai_agents_sdk_runs_a_function_tool(server, api_key, model_kind):
    output, calls = _agents_run(server, api_key, model_kind)
    assert len(calls) == 1
    name, country = calls[0]
    assert isinstance(name, str) and isinstance(country, str)
    assert output == f"recorded {name}"


# -- LangChain ------------------------------------------------------------------------------

def test_langchain_chat_anthropic_reports_cache_reads_on_the_second_call(server, api_key):
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import HumanMessage, SystemMessage

    chat = ChatAnthropic(model="claude-sonnet-4", base_url=server.base_url, api_key=api_key,
                         max_tokens=16, max_retries=0)
    system = SystemMessage(content=[{"type": "text", "text": "LangChain desk. " + SYSTEM,
                                     "cache_control": {"type": "ephemeral"}}])
    first = chat.invoke([system, HumanMessage("Name one city.")])
    second = chat.invoke([system, HumanMessage("Name another city.")])
    first_details = first.usage_metadata.get("input_token_details", {})
    details = second.usage_metadata["input_token_details"]
    assert first_details.get("cache_read", 0) < 32     # at most the chat template's header
    assert details["cache_read"] >= 150          # the system block, read from the cache
    assert second.usage_metadata["input_tokens"] >= details["cache_read"]


def test_langchain_chat_openai_structured_output(server, api_key):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model="gpt-4o-mini", base_url=server.base_url + "/v1", api_key=api_key,
                      max_tokens=96, temperature=0.0, max_retries=0)
    answer = chat.with_structured_output(City).invoke(QUESTION)
    assert isinstance(answer, City)


# -- instructor -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_returns_the_response_model(server, api_key, mode):
    import instructor
    import openai

    client = instructor.from_openai(
        openai.OpenAI(base_url=server.base_url + "/v1", api_key=api_key, max_retries=0),
        mode=getattr(instructor.Mode, mode))
    answer = client.chat.completions.create(
        model="gpt-4o-mini", response_model=City, max_tokens=96, temperature=0.0, max_retries=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
    assert isinstance(answer, City)


# -- LiteLLM --------------------------------------------------------------------------------

def _litellm_twice(model: str, api_base: str, api_key: str, question: str):
    import litellm

    messages = [{"role": "system", "content": f"LiteLLM {model}. " + SYSTEM},
                {"role": "user", "content": question}]
    replies = [litellm.completion(model=model, api_base=api_base, api_key=api_key,
                                  messages=messages, max_tokens=8, num_retries=0)
               for _ in range(2)]
    return replies


def test_litellm_openai_route_reports_cached_tokens(server, api_key):
    first, second = _litellm_twice("openai/gpt-4o-mini", server.base_url + "/v1", api_key,
                                   QUESTION)
    assert first.choices[0].message.content is not None
    assert (first.usage.prompt_tokens_details.cached_tokens or 0) < 32   # the header at most
    assert second.usage.prompt_tokens_details.cached_tokens >= 150
    assert second.usage.prompt_tokens >= second.usage.prompt_tokens_details.cached_tokens


def test_litellm_anthropic_route_answers_and_counts_cache_reads(server, api_key):
    import litellm

    system = [{"type": "text", "text": "LiteLLM anthropic. " + SYSTEM,
               "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]
    replies = [litellm.completion(model="anthropic/claude-sonnet-4", api_base=server.base_url,
                                  api_key=api_key, messages=messages, max_tokens=8,
                                  num_retries=0) for _ in range(2)]
    assert replies[0].choices[0].message.content
    assert replies[1].usage.prompt_tokens_details.cached_tokens >= 150
