"""Constrained decoding inside the engine: next-token masks, tokens into the grammar,
jump-forward.

A request with ``Request.grammar`` (a ``grammar.RequestGrammar``) is constrained; others
never touch this module's work. Each step, ``MaskWorker.start`` hands the constrained
sampling rows' grammars to one worker thread, which computes their next-token bitmasks
while the forward pass runs (llguidance releases the interpreter lock; on a CPU forward
without a spare core, before it, see ``MaskWorker``; one after another, or by llguidance's
batched fill where at least two cores are spare, see ``MaskFill``) and unpacks them
into a ``[k, V]`` boolean "banned" tensor; the sampler waits for it only after the forward
and applies it to those k rows alone (``sampling.TokenMasks``).

After a token is sampled, ``append_constrained`` feeds it to the grammar. Where the grammar
then allows exactly one continuation (JSON keys, punctuation, a tool call's fixed text),
those tokens are appended without sampling (jump-forward) and computed together in the next
step, as one multi-token chunk. The grammar wins over ``min_tokens`` and ``ignore_eos``:
when it allows nothing but the end, the answer ends (reason EOS). Jump-forward is off for
requests that ask for logprobs (forced tokens have no distribution of their own).
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from .api import ErrorKind, FinishReason
from .output import EndCause, append_token
from .sampling import TokenMasks
from .sequence import Sequence

BATCHED_MIN_ROWS = 2    # where cores are spare: from this many rows, llguidance's batched fill


class PendingMasks:
    """Masks being computed for ``rows`` (indices into the step's sampling rows)."""

    def __init__(self, rows: tuple[int, ...], future: Future):
        self.rows = rows
        self._future = future

    def result(self) -> TokenMasks:
        banned, ends_only = self._future.result()
        return TokenMasks(self.rows, banned, frozenset(self.rows[i] for i in ends_only))

    def wait(self) -> None:
        """Blocks until the computation ended (its outcome, an error included, is dropped)."""
        self._future.exception()


class MaskWorker:
    """One thread that computes masks during forward passes (started at first use).

    Overlapping needs a core the forward does not use: with the model on an accelerator,
    or on a CPU with more cores than torch's threads. Otherwise (a CPU forward on every
    core) the masks are computed on the engine thread before the forward instead: a thread
    that takes a core from torch's parallel ops stalls each of them (measured: +20% per
    16-stream step on 2 cores, for masks that cost ~0.5 ms alone)."""

    def __init__(self, vocab_size: int, device="cpu"):
        self.vocab_size = vocab_size
        accelerated = torch.device(device).type != "cpu"
        self.overlap = accelerated or spare_cpu_core()
        self.fill = MaskFill.for_machine(accelerated)
        self._executor: ThreadPoolExecutor | None = None

    def start(self, seqs: list[Sequence]) -> PendingMasks | None:
        """Starts the masks of the constrained ``seqs`` (the step's sampling rows, in row
        order); None when none is constrained (the step pays nothing)."""
        rows = tuple(i for i, seq in enumerate(seqs) if seq.grammar is not None)
        if not rows:
            return None
        if self._executor is None and self.overlap:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        grammars = [seqs[i].grammar for i in rows]
        if not self.overlap:
            done: Future = Future()
            done.set_result(compute_masks(grammars, self.vocab_size, self.fill))
            return PendingMasks(rows, done)
        return PendingMasks(rows, self._executor.submit(compute_masks, grammars,
                                                        self.vocab_size, self.fill))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)


class MaskFill:
    """How a step's k bitmasks are filled: one grammar after another on the calling thread,
    or, from ``min_rows`` rows on (None: never), by llguidance's batched fill over its own
    pool of ``threads`` threads (``LLExecutor``, made at first use).

    The pool's threads compete with torch's for cores: on 2 cores the batched fill lost
    (0.90-0.92x decode at 1 and 16 constrained streams, benchmarks/RESULTS.md), so it is
    used only where at least two cores are left over (``spare_mask_threads``)."""

    def __init__(self, min_rows: int | None, threads: int = 2):
        self.min_rows = min_rows
        self.threads = threads
        self._pool = None

    @classmethod
    def for_machine(cls, accelerated: bool) -> "MaskFill":
        spare = spare_mask_threads(len(os.sched_getaffinity(0)), torch.get_num_threads(),
                                   accelerated)
        return cls(BATCHED_MIN_ROWS if spare >= 2 else None, max(spare, 1))

    def __call__(self, grammars, bits: torch.Tensor) -> None:
        """Fills ``bits`` [k, W] int32 (row i: grammars[i]'s next-token bitmask)."""
        mask_bytes = bits.shape[1] * bits.element_size()
        if self.min_rows is None or len(grammars) < self.min_rows:
            for i, grammar in enumerate(grammars):
                grammar.fill_mask(bits[i].data_ptr(), mask_bytes)
            return
        from .grammar import fill_masks_batched, mask_pool   # llguidance, once constrained
        if self._pool is None:
            self._pool = mask_pool(self.threads)
        fill_masks_batched(self._pool, grammars, bits.data_ptr(), mask_bytes)


def spare_mask_threads(cores: int, torch_threads: int, accelerated: bool) -> int:
    """Cores neither the engine thread nor torch's CPU threads use (with an accelerator
    the forward runs there, and only the engine thread holds a core), at most 16."""
    busy = 1 if accelerated else max(torch_threads, 1)
    return max(0, min(cores - busy, 16))


def spare_cpu_core() -> bool:
    """More usable cores than torch's intra-op threads."""
    return len(os.sched_getaffinity(0)) > torch.get_num_threads()


def compute_masks(grammars, vocab_size: int, fill: MaskFill | None = None
                  ) -> tuple[torch.Tensor, list[int]]:
    """(banned [k, V] bool, the indices of grammars that allow only the end)."""
    words = (vocab_size + 31) // 32
    bits = torch.empty((len(grammars), words), dtype=torch.int32)          # [k, W]
    (fill or MaskFill(None))(grammars, bits)
    inverted = np.invert(bits.numpy().view(np.uint8))                      # [k, 4W]
    banned = np.unpackbits(inverted, axis=1, count=vocab_size, bitorder="little")  # [k, V]
    banned = torch.from_numpy(banned).view(torch.bool)                      # 0/1 bytes as bool
    return banned, [i for i, grammar in enumerate(grammars) if grammar.only_end]


def append_constrained(seq: Sequence, token: int, eos_ids: set[int], max_model_len: int,
                       logprob=None, jump_forward: bool = True) -> EndCause | None:
    """``output.append_token`` for a constrained sequence: the token goes into the grammar
    first, then the forced continuation (``jump_forward``). Returns an EndCause when seq ends."""
    grammar = seq.grammar
    if grammar.only_end:
        return EndCause(FinishReason.EOS)
    if not grammar.consume(token):
        return _grammar_failed(seq, grammar)
    finish = append_token(seq, token, eos_ids, max_model_len, logprob)
    if finish is not None or grammar.only_end:
        return finish or EndCause(FinishReason.EOS)
    if not jump_forward or seq.params.logprobs is not None:
        return None
    for forced in grammar.forced_tokens():
        if not grammar.consume(forced):
            return _grammar_failed(seq, grammar)
        finish = append_token(seq, forced, eos_ids, max_model_len)
        if finish is not None:
            return finish
    return EndCause(FinishReason.EOS) if grammar.only_end else None


def _grammar_failed(seq: Sequence, grammar) -> EndCause:
    return EndCause(FinishReason.ERROR, kind=ErrorKind.BAD_REQUEST,
                  message=f"the output grammar stopped at output token {seq.num_output + 1}: "
                          f"{grammar.error or 'the token is not allowed'}")
