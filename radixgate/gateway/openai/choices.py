"""Several choices in one OpenAI request: ``n`` per prompt and batched prompts.

Each choice is its own engine request (radixgate/gateway/pipeline.py: ``choice_id``,
``choice_sampling``). The ``n`` choices of one prompt share its KV
through the radix tree: the first prefills it, the others wait for that prefill (the
scheduler holds a request whose prompt a running prefill covers) and then read it from the
cache, computing only the last prompt token. Usage counts each prompt once, as OpenAI does.
Seeded choices use ``seed + i``, so they differ from each other and stay reproducible.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

from radixgate.runtime.engine.api import Finished


async def results(generations: Sequence) -> list[Finished]:
    """Runs every choice to its end; the first failure raises (the others are aborted)."""
    async with contextlib.AsyncExitStack() as stack:
        for generation in generations:
            await stack.enter_async_context(generation)
        return [await generation.result() for generation in generations]


def openai_usage(prompt: int, cached: int, completion: int, created: int = 0) -> dict:
    """OpenAI's usage object; ``created``: prompt tokens pinned by ``prompt_cache_retention``
    (reported as ``prompt_tokens_details.cache_creation_tokens`` when there are any)."""
    details = {"cached_tokens": cached}
    if created:
        details["cache_creation_tokens"] = created
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "prompt_tokens_details": details,
            "completion_tokens_details": {"reasoning_tokens": 0}}


def shared_prompt_usage(finished: Sequence[Finished]) -> dict:
    """Choices of one prompt: the prompt counted once (as the first choice saw it)."""
    first = finished[0].usage
    return openai_usage(first.prompt_tokens, first.cache_read_tokens,
                        sum(f.usage.output_tokens for f in finished),
                        first.cache_creation_tokens)


def batched_usage(finished: Sequence[Finished], per_prompt: int) -> dict:
    """``per_prompt`` choices of each prompt in a row: each prompt counted once."""
    prompts = finished[::per_prompt]
    return openai_usage(sum(f.usage.prompt_tokens for f in prompts),
                        sum(f.usage.cache_read_tokens for f in prompts),
                        sum(f.usage.output_tokens for f in finished),
                        sum(f.usage.cache_creation_tokens for f in prompts))
