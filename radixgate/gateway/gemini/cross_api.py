"""An explicit cache named from the Anthropic and OpenAI APIs (an extension field,
``cached_content``: one mechanism, three APIs).

The cache's system instruction, tools and turns come first, then the request's messages; as
in Gemini's API the request may not bring a system prompt or tools of its own (400). The
cache's breakpoint pins it again for its remaining time; another tenant's or an expired name
is a 404 in the route's own error envelope.
"""
from __future__ import annotations

from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.gemini.cache_store import handle_prefix, store_of
from radixgate.gateway.gemini.convert import convert_prompt
from radixgate.gateway.gemini.schemas import PromptFields
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.render import Conversation


def with_cached_content(state, tenant: str, name: str | None,
                        converted: ConvertedPrompt, has_tools: bool) -> ConvertedPrompt:
    """``converted`` (a request's own prompt) after the cache ``name`` (None: as it is)."""
    if name is None:
        return converted
    if converted.conversation.system or has_tools:
        raise ApiError(Kind.BAD_REQUEST, "cached_content cannot be used with a system prompt "
                       "or tools of the request's own: the cache brings them",
                       param="cached_content")
    handle = store_of(state).get(tenant, name)
    if handle is None:
        raise ApiError(Kind.NOT_FOUND, f"cached_content {name!r} not found (or permission "
                       "denied)", param="cached_content")
    cache = convert_prompt(PromptFields(), None, handle_prefix(handle))
    own = converted.conversation
    conversation = Conversation(cache.conversation.system,
                                cache.conversation.messages + own.messages, own.prefill)
    return ConvertedPrompt(conversation, converted.tool_names or cache.tool_names,
                           converted.output_prefix, converted.constraint or cache.constraint,
                           converted.max_tool_calls)
