"""OpenAI's log-probability shapes from the engine's ``TokenLogprob`` entries.

The values are taken from the model's own distribution at each step: the log-softmax of
its logits at temperature 1, before penalties, ``logit_bias`` and top-k/top-p/min-p
filtering (vLLM's default), so they describe the model, not the sampler's settings.

- chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}``
- completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``
"""
from __future__ import annotations

from typing import Callable, Sequence

from radixgate.gateway.errors import ApiError, Kind
from radixgate.runtime.engine.api import TokenLogprob

MAX_TOP_LOGPROBS = 20
TokenBytes = Callable[[int], bytes]


def chat_logprobs_asked(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """The engine's ``SamplingParams.logprobs`` for a chat request (None: off)."""
    if top_logprobs is not None and not logprobs:
        raise ApiError(Kind.BAD_REQUEST, "top_logprobs needs logprobs: true", param="top_logprobs")
    return (top_logprobs or 0) if logprobs else None


def chat_content(entries: Sequence[TokenLogprob], token_bytes: TokenBytes) -> list[dict]:
    return [{**_token(e.token_id, e.logprob, token_bytes),
             "top_logprobs": [_token(t, lp, token_bytes) for t, lp in e.top]} for e in entries]


def chat_logprobs(entries: Sequence[TokenLogprob], token_bytes: TokenBytes) -> dict:
    return {"content": chat_content(entries, token_bytes), "refusal": None}


def completion_logprobs(entries: Sequence[TokenLogprob], token_bytes: TokenBytes,
                        offset: int = 0, prompt: Sequence[int] = (),
                        prompt_entries: Sequence[TokenLogprob | None] = ()) -> dict:
    """The legacy shape; ``offset``: where the first token's text starts in the choice's
    text (for streamed chunks). With an echoed ``prompt`` (its ids) and ``prompt_entries``
    (one per prompt token, the first None), the prompt's tokens come first."""
    ids = [*prompt, *(e.token_id for e in entries)]
    all_entries = [*prompt_entries, *entries]
    tokens, offsets = [], []
    for token_id in ids:
        offsets.append(offset)
        text = _text(token_bytes(token_id))
        tokens.append(text)
        offset += len(text)
    return {"tokens": tokens,
            "token_logprobs": [e.logprob if e else None for e in all_entries],
            "top_logprobs": [{_text(token_bytes(t)): lp for t, lp in e.top} if e else None
                             for e in all_entries],
            "text_offset": offsets}


def _token(token_id: int, logprob: float, token_bytes: TokenBytes) -> dict:
    raw = token_bytes(token_id)
    return {"token": _text(raw), "logprob": logprob, "bytes": list(raw)}


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")
