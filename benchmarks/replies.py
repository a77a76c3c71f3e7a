"""The token ids of every reply a bench server generated, for the offline upper bound.

After a request the engine caches prompt + output[:-1] (``radixgate/kv/manager.py``), and a
session's next scripted turn re-sends the prompt followed by the *scripted* assistant turn: where
the model's reply begins like that turn, the server reuses more than a replay of prompts
alone allows. So the bound replays prompt + reply[:-1], and needs the reply's exact ids. The
HTTP APIs return text only (re-tokenizing it need not give the same ids), so the cache-on
bench server runs as ``python -m benchmarks.replies LOG serve ARGS...``: ``radixgate
serve`` unchanged, except that its engine is wrapped to append one JSON line per finished
request to ``LOG``: ``{"prompt": sha1 of the prompt ids, "output": [ids]}``.
"""
from __future__ import annotations

import hashlib
import json
import sys
from array import array
from pathlib import Path

from radixgate.runtime.engine.api import Finished


def prompt_key(tokens) -> str:
    """A short stable key of a prompt's token ids (the log stores no prompts)."""
    return hashlib.sha1(array("q", tokens).tobytes()).hexdigest()


def load_replies(path: Path) -> dict[str, tuple[int, ...]]:
    """prompt key -> the reply's output token ids, from a log ``RecordingEngine`` wrote."""
    if not path.exists():
        return {}
    replies = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        replies[record["prompt"]] = tuple(record["output"])
    return replies


class RecordingHandle:
    """A ``RequestHandle`` that logs the Finished event as it passes through."""

    def __init__(self, handle, prompt_tokens, write):
        self._handle, self._prompt, self._write = handle, prompt_tokens, write

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    def __aiter__(self) -> "RecordingHandle":
        return self

    async def __anext__(self):
        event = await self._handle.__anext__()
        if isinstance(event, Finished) and event.error_kind is None:
            self._write(self._prompt, event.output_token_ids)
        return event

    async def result(self) -> Finished:
        async for _ in self:
            pass
        return self._handle.finished

    async def __aenter__(self) -> "RecordingHandle":
        await self._handle.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._handle.__aexit__(*exc)


class RecordingEngine:
    """The engine with ``submit`` returning a ``RecordingHandle``; everything else passes
    through. Only the event loop thread writes the log."""

    def __init__(self, engine, log_path: Path):
        self._engine = engine
        self._log = open(log_path, "a", buffering=1)

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def submit(self, request):
        return RecordingHandle(self._engine.submit(request), request.tokens, self._write)

    def _write(self, prompt, output) -> None:
        self._log.write(json.dumps({"prompt": prompt_key(prompt), "output": list(output)}) + "\n")


def main(argv: list[str]) -> int:
    """``LOG serve ARGS...``: ``radixgate serve ARGS...`` with a recording engine."""
    from radixgate.gateway import cli, state
    log_path, rest = Path(argv[0]), argv[1:]
    make_engine = state.default_engine_factory
    # GatewayState reads this name when it is built, so every serve flag works unchanged
    state.default_engine_factory = lambda config: RecordingEngine(make_engine(config), log_path)
    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
