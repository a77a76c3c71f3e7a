"""Per-request state inside the engine thread.

A sequence's ``tokens`` are its prompt followed by its output so far. Positions
``[0, num_computed)`` have K/V in the blocks of ``kv.block_table`` (position ``i`` in slot
``i % B`` of ``block_table[i // B]``). Each step computes ``tokens[num_computed:...]``; when
``num_computed`` reaches ``len(tokens)`` the last row's logits pick the next token, so a
decode step is simply a one-token chunk. Its KV state (``kv``: blocks, tree lock, window
holds, tier load; radixgate/kv/sequence_kv.py) is the ``KVManager``'s to change.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from radixgate.kv.sequence_kv import SequenceKV

from .api import Breakpoint, Request
from .trace import RequestTrace


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class Timing:
    submitted: float = field(default_factory=time.monotonic)
    first_scheduled: float | None = None
    first_token: float | None = None


@dataclass(slots=True)
class PromptAccounting:
    """Set at the first admission (a resumed request keeps its first numbers)."""

    cache_read: int = 0
    creation_5m: int = 0
    creation_1h: int = 0
    creation_24h: int = 0       # pinned for a day (OpenAI's prompt_cache_retention "24h")
    cache_read_disk: int = 0    # of cache_read, loaded from the disk tier
    pin_outcomes: tuple = ()    # (offset, outcome) per prompt breakpoint (usage.pin_outcomes)


@dataclass(slots=True)
class OutputState:
    """What the request has said and what it holds back (``output.py`` writes it): tokens
    go through ``detok`` into text, the text through ``stops``; ``pending_*`` wait for
    their text to be complete, ``text_parts`` and ``sent_logprobs`` were sent."""

    stops: object = None                 # stop.StopMatcher
    detok: object = None                 # detokenize.IncrementalDetokenizer
    text_parts: list[str] = field(default_factory=list)
    pending_ids: list[int] = field(default_factory=list)    # tokens whose text is not sent
    pending_logprobs: list = field(default_factory=list)    # their TokenLogprobs (if asked)
    sent_logprobs: list = field(default_factory=list)       # of every token already sent
    prompt_logprobs: list = field(default_factory=lambda: [None])   # per prompt token (if
    # asked): none for the first


@dataclass(slots=True)
class LogitsRecord:
    """``record_logits``: per sampled token, the top-2 gap and the logits row."""

    gaps: list[float] = field(default_factory=list)
    rows: list = field(default_factory=list)

    def trace(self) -> RequestTrace:
        return RequestTrace(tuple(self.gaps), tuple(self.rows))


class Sequence:
    """One request's state (engine thread only): its tokens, and in objects of their own
    its blocks and lock (``kv``), its output (``output``), its drafts' source
    (``drafter``), its grammar state (``grammar``) and its ``record_logits`` record
    (``logits``)."""

    def __init__(self, request: Request, *, arrival: int, sink=None, generator=None,
                 output: OutputState | None = None, logits: LogitsRecord | None = None):
        """``arrival``: the submission order (newest = largest); ``sink`` receives the
        TextDelta / Finished events; ``generator``: a seeded ``torch.Generator`` (None:
        the global one or greedy); ``output``: the stop matcher and detokenizer (a bare
        ``OutputState`` when None: a sequence that never emits, as in scheduler tests);
        ``logits``: a ``LogitsRecord`` when ``record_logits`` asks for one."""
        self.request = request
        self.sink = sink
        self.arrival = arrival
        self.generator = generator
        self.token_counts = None            # sampling.TokenCounts, made at the first sample
        self.output = output if output is not None else OutputState()
        self.logits = logits
        self.grammar = request.grammar      # grammar.RequestGrammar (this request's) or None
        self.drafter = None                 # spec.Drafter, made at its first decode step
        self.tokens: list[int] = list(request.tokens)
        self.num_prompt = len(request.tokens)
        self.kv = SequenceKV()              # blocks, lock, window holds, tier load
        self.num_computed = 0
        self.status = SeqStatus.WAITING
        self.admitted_once = False
        self.num_preemptions = 0
        self.waiting_on: Sequence | None = None   # a running sequence prefilling our prefix
        self.admission_failures = 0                # admissions that raised (retried a few times)
        self.timing = Timing()
        self.accounting = PromptAccounting()
        self.pins_done = False              # breakpoints pinned (once, after first prefill)

    # -- identity -----------------------------------------------------------------------
    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def tenant(self) -> str:
        return self.request.tenant

    @property
    def namespace(self) -> str:
        return self.request.namespace

    @property
    def params(self):
        return self.request.sampling

    # -- progress -----------------------------------------------------------------------
    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt:]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def remaining_prefill(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return len(self.tokens) - self.num_computed

    @property
    def is_prefilling(self) -> bool:
        """True while the tokens present at admission are not all computed yet."""
        return self.status is SeqStatus.RUNNING and not self.kv.prefill_inserted

    def prompt_breakpoints(self) -> list[Breakpoint]:
        """Breakpoints inside the prompt, shortest prefix first."""
        inside = [b for b in self.request.breakpoints if 0 < b.offset <= self.num_prompt]
        return sorted(inside, key=lambda b: b.offset)
