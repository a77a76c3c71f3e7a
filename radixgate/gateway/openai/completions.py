"""POST /v1/completions (OpenAI legacy completions): a text or token-id prompt, or a batch
of them (a list of strings or of token lists: one choice per prompt and per ``n``, in
order, index ``prompt * n + j``), ``echo`` (the prompt's text before each choice's text),
``logprobs``, streaming. ``suffix`` is refused (400): the model has no fill-in-the-middle.
"""
from __future__ import annotations

import time

from aiohttp import web

from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.http_util import request_id_of
from radixgate.gateway.openai.chat import (FINISH_REASONS, error_and_done, reject_unsupported,
                                           usage_and_done, usage_body)
from radixgate.gateway.openai.choices import batched_usage, results
from radixgate.gateway.openai.logprobs import completion_logprobs
from radixgate.gateway.openai.retention import retention_pin_s
from radixgate.gateway.openai.schemas import CompletionRequest
from radixgate.gateway.pipeline import Ask, admit
from radixgate.gateway.prepare import check_length_bound, too_long
from radixgate.gateway.streaming import Frame, stream_answer, stream_choices
from radixgate.gateway.constraint_fields import openai_constraint
from radixgate.runtime.engine.api import Finished

MAX_PROMPTS = 32        # prompts in one batched request


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)


def _ask(state, principal, body: CompletionRequest) -> Ask:
    reject_unsupported(body)
    _check_options(body)

    def tokenize(room: int, reserved: int) -> list[list[int]]:
        return prompt_token_lists(state, body, room, reserved)

    return Ask("openai", body, constraint=openai_constraint(body), tokenize=tokenize,
               max_tokens=body.max_tokens or 16, stop=body.stop, n=body.n,
               logprobs=body.logprobs, prompt_logprobs=body.logprobs if body.echo else None,
               cache_salt=body.cache_salt,
               pin_prompt_s=retention_pin_s(state, body.prompt_cache_retention))


async def completions(request: web.Request) -> web.StreamResponse:
    admitted = await admit(request, CompletionRequest, _ask)
    state, body, generations = admitted.state, admitted.body, admitted.generations
    prompts = [prompt.tokens for prompt in admitted.prompts]
    prompt_echoes = [_echo_text(state, body, tokens) for tokens in prompts]   # once a prompt
    echoes = [echo for echo in prompt_echoes for _ in range(body.n)]
    token_bytes = state.tokenizer.token_to_bytes if body.logprobs is not None else None
    completion_id = "cmpl-" + request_id_of(request).removeprefix("req_")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream:
        return await _stream(request, generations, body, completion_id, include_usage,
                             token_bytes, echoes)
    finished = await results(generations)
    prompt_ids = [tokens if body.echo else [] for tokens in prompts for _ in range(body.n)]
    choices = [completion_choice(i, f, token_bytes, echo, ids) for i, (f, echo, ids)
               in enumerate(zip(finished, echoes, prompt_ids))]
    response_body = {"id": completion_id, "object": "text_completion",
                     "created": int(time.time()), "model": body.model, "choices": choices,
                     "usage": batched_usage(finished, body.n), "system_fingerprint": None}
    if body.prompt_cache_retention is not None:
        response_body["prompt_cache_retention"] = body.prompt_cache_retention
    return web.json_response(response_body)


def _check_options(body: CompletionRequest) -> None:
    if body.suffix:
        raise ApiError(Kind.BAD_REQUEST, "suffix is not supported: this model has no "
                       "fill-in-the-middle mode", param="suffix")


def completion_choice(index: int, finished: Finished, token_bytes, echo: str,
            prompt_ids: list[int]) -> dict:
    """``echo``: the prompt's text first; with logprobs, its tokens' (the first null)."""
    logprobs = None
    if token_bytes is not None:
        logprobs = completion_logprobs(finished.logprobs, token_bytes, prompt=prompt_ids,
                                       prompt_entries=finished.prompt_logprobs if echo else ())
    return {"index": index, "text": echo + finished.text, "logprobs": logprobs,
            "finish_reason": FINISH_REASONS.get(finished.reason, "stop")}


def _echo_text(state, body: CompletionRequest, tokens: list[int]) -> str:
    return state.tokenizer.decode(tokens) if body.echo else ""


async def _stream(request, generations, body, completion_id, include_usage, token_bytes,
                  echoes) -> web.StreamResponse:
    single = len(generations) == 1
    streams = [CompletionStream(completion_id, body.model, include_usage, token_bytes,
                                index=i, final=single, echo=echo)
               for i, echo in enumerate(echoes)]
    if single:
        return await stream_answer(request, generations[0], streams[0])

    def closing(finished: list[Finished]) -> list[Frame]:
        return usage_and_done(streams[0].base, include_usage, batched_usage(finished, body.n))

    return await stream_choices(request, generations, streams, closing)


# -- prompts ------------------------------------------------------------------------------

def prompt_token_lists(state, body: CompletionRequest, room: int,
                        max_tokens: int) -> list[list[int]]:
    """Every prompt's token ids; 400 when one cannot fit ``room`` (a text's cheap length
    bound is checked before it is tokenized)."""
    prompts = _prompts(body.prompt)
    out = []
    for prompt in prompts:
        tokens = _given_tokens(state, prompt, room, max_tokens)
        if len(tokens) > room:
            raise too_long(room, max_tokens, context=room + max_tokens, at_least=len(tokens))
        out.append(tokens)
    return out


def _prompts(prompt) -> list:
    """A batch (a list of strings or of token lists) or one prompt, as a list."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) > MAX_PROMPTS:
            raise ApiError(Kind.BAD_REQUEST, f"at most {MAX_PROMPTS} prompts in one request",
                           param="prompt")
        return list(prompt)
    return [prompt]


def _given_tokens(state, prompt, room: int, max_tokens: int) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(Kind.BAD_REQUEST, "prompt must not be empty", param="prompt")
        check_length_bound([prompt], state.tokenizer, room, max_tokens)
        return state.tokenizer.encode(prompt)
    if not prompt:
        raise ApiError(Kind.BAD_REQUEST, "prompt must not be empty", param="prompt")
    vocab = state.tokenizer.vocab_size
    if any(t < 0 or t >= vocab for t in prompt):
        raise ApiError(Kind.BAD_REQUEST, f"prompt token ids must lie in [0, {vocab})",
                       param="prompt")
    return list(prompt)


class CompletionStream:
    """text_completion chunks of one choice; ``final`` False: one of several (no usage and
    no ``[DONE]`` at its end); ``echo``: the prompt's text, sent first."""

    has_tool_call = False          # plain completions never parse tool calls

    def __init__(self, completion_id: str, model: str, include_usage: bool, token_bytes=None,
                 index: int = 0, final: bool = True, echo: str = ""):
        self.base = {"id": completion_id, "object": "text_completion",
                     "created": int(time.time()), "model": model, "system_fingerprint": None}
        self.include_usage = include_usage
        self.token_bytes = token_bytes      # set: each chunk carries its tokens' logprobs
        self.index, self.final, self.echo = index, final, echo
        self.offset = 0                     # text sent so far (text_offset of the next token)

    def _chunk(self, text: str, finish_reason=None) -> dict:
        chunk = {**self.base, "choices": [{"index": self.index, "text": text, "logprobs": None,
                                           "finish_reason": finish_reason}]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def start(self, first) -> list[Frame]:
        return [(None, self._chunk(self.echo))] if self.echo else []

    def delta(self, event) -> list[Frame]:
        if not event.text:
            return []
        chunk = self._chunk(event.text)
        if self.token_bytes is not None:
            chunk["choices"][0]["logprobs"] = completion_logprobs(
                event.logprobs, self.token_bytes, self.offset)
        self.offset += len(event.text)
        return [(None, chunk)]

    def end(self, finished: Finished) -> list[Frame]:
        frames = [(None, self._chunk("", FINISH_REASONS.get(finished.reason, "stop")))]
        return frames + (usage_and_done(self.base, self.include_usage,
                                        usage_body(finished.usage)) if self.final else [])

    def error(self, error: ApiError) -> list[Frame]:
        return error_and_done(error)
