"""vLLM's utility routes: ``POST /tokenize``, ``POST /detokenize``, ``GET /version``.

``/tokenize`` takes a ``prompt`` (tokenized as ``/v1/completions`` tokenizes it; with
``add_special_tokens: false``, special-token text stays plain text) or chat ``messages``
(rendered exactly as ``/v1/chat/completions`` renders them, generation prompt included) and
answers ``{tokens, count, max_model_len}``; ``/detokenize`` turns ``tokens`` back into
``{prompt}``. Both need a key and count against the tenant's rate limit and preparing slot.
"""
from __future__ import annotations

import asyncio
from importlib import metadata

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from radixgate.gateway.streaming import admitted_body
from radixgate.gateway.openai.convert import convert_chat_request
from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.openai.schemas import ChatCompletionRequest, ChatMessageIn
from radixgate.gateway.pipeline import prompt_tokens

PATHS = ("/tokenize", "/detokenize")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessageIn] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int] = Field(max_length=1 << 20)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/version", version)


async def tokenize(request: web.Request) -> web.Response:
    async with admitted_body(request, TokenizeRequest) as (state, principal, body):
        engine = state.require_engine()
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(Kind.BAD_REQUEST, "give exactly one of prompt and messages")
        if body.messages is not None:
            tokens = await _chat_tokens(state, principal, body)
        else:
            encode = (state.tokenizer.encode if body.add_special_tokens
                      else state.tokenizer.encode_plain)
            tokens = await asyncio.to_thread(encode, body.prompt)
    return web.json_response({"tokens": tokens, "count": len(tokens),
                              "max_model_len": engine.max_model_len})


async def _chat_tokens(state, principal, body: TokenizeRequest) -> list[int]:
    if not body.add_generation_prompt:
        raise ApiError(Kind.BAD_REQUEST, "add_generation_prompt: false is not supported: the "
                       "chat template is rendered as /v1/chat/completions renders it",
                       param="add_generation_prompt")
    chat = ChatCompletionRequest(model=body.model, messages=body.messages)
    return await prompt_tokens(state, principal, convert_chat_request(chat))


async def detokenize(request: web.Request) -> web.Response:
    async with admitted_body(request, DetokenizeRequest) as (state, _, body):
        state.require_engine()
        vocab = state.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in body.tokens):
            raise ApiError(Kind.BAD_REQUEST, f"tokens must lie in [0, {vocab})", param="tokens")
        text = await asyncio.to_thread(state.tokenizer.decode, body.tokens)
    return web.json_response({"prompt": text})


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": _version()})


def _version() -> str:
    try:
        return metadata.version("radixgate")
    except metadata.PackageNotFoundError:
        return "unknown"
