"""Per-request state inside the engine thread.

A sequence's ``tokens`` are its prompt followed by its output so far. Positions
``[0, num_computed)`` have K/V in the blocks of ``block_table`` (position ``i`` in slot
``i % B`` of ``block_table[i // B]``). Each step computes ``tokens[num_computed:...]``; when
``num_computed`` reaches ``len(tokens)`` the last row's logits pick the next token, so a
decode step is simply a one-token chunk. The sequence holds one pool reference per entry of
``block_table`` and, while running, one tree lock (``lock_handle``) on its cached path.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from .api import Breakpoint, Request


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


class Sequence:
    """One request's tokens, blocks, lock and output state (engine thread only)."""

    def __init__(self, request: Request, sink, arrival: int, generator, stops, detok):
        self.request = request
        self.sink = sink                    # receives TextDelta / Finished events
        self.arrival = arrival              # submission order (newest = largest)
        self.generator = generator          # torch.Generator or None (greedy)
        self.token_counts = None            # sampling.TokenCounts, made at the first sample
        self.stops = stops                  # StopMatcher
        self.detok = detok                  # IncrementalDetokenizer
        self.tokens: list[int] = list(request.tokens)
        self.num_prompt = len(request.tokens)
        self.block_table: list[int] = []
        self.window_held: dict[int, None] = {}   # table indices whose window data it holds
        self.num_computed = 0
        self.lock_handle = None
        self.status = SeqStatus.WAITING
        self.prefill_inserted = False       # tokens prefilled at admission are in the tree
        self.admitted_once = False
        self.num_preemptions = 0
        self.waiting_on: Sequence | None = None   # a running sequence prefilling our prefix
        self.admission_failures = 0                # admissions that raised (retried a few times)
        self.tier_load = None               # kv.tiers.disk.LoadTicket while its prefix loads
        self.tier_chain = None              # (len(tokens), its full-block hashes) for the tier
        self.disk_read = 0                  # prompt tokens the tier loaded at its admission
        self.timing = Timing()
        self.accounting = PromptAccounting()
        self.text_parts: list[str] = []
        self.pending_ids: list[int] = []    # tokens whose text is not sent yet
        self.pending_logprobs: list = []    # their TokenLogprobs (when the request asks)
        self.sent_logprobs: list = []       # TokenLogprobs of every token already sent
        self.prompt_logprobs: list = [None]  # per prompt token (asked for): none for the first
        self.pins_done = False              # breakpoints pinned (once, after first prefill)
        self.gaps: list[float] = []         # record_logits: top-2 gap per sampled token
        self.logit_rows: list = []          # record_logits: logits row per sampled token
        self.drafter = None                 # spec.Drafter, made at its first decode step

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
        return self.status is SeqStatus.RUNNING and not self.prefill_inserted

    def blocks_needed(self, num_tokens: int, block_size: int) -> int:
        """Blocks to add so positions [0, num_tokens) have a block."""
        return max(0, -(-num_tokens // block_size) - len(self.block_table))

    def prompt_breakpoints(self) -> list[Breakpoint]:
        """Breakpoints inside the prompt, shortest prefix first."""
        inside = [b for b in self.request.breakpoints if 0 < b.offset <= self.num_prompt]
        return sorted(inside, key=lambda b: b.offset)
