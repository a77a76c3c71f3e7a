"""How a KV budget splits between the main pool and the window layers' pool (pure Python:
the engine and ``radixgate plan`` both use it; docs/ARCHITECTURE.md section 9b).

Per block, the main pool stores the global layers and the window pool the window layers.
With ``ratio`` r (window blocks per main block) a budget of ``b`` bytes buys
``N = b / (B x layer bytes x (L_global + r L_window))`` main blocks and ``r N`` window ones.
A running sequence needs about ``W + step + B`` tokens of window blocks, whatever its length;
the tree keeps window data for cached prefixes as long as room lasts (tombstones after), and
a cached prefix stays usable while its end's ``W + B`` tokens keep theirs: a tree of P branch
ends worth keeping needs about ``P (W + B)`` tokens of window blocks. The ``auto`` ratio is
``2 (W + step) / context``, at least 1/2 (room for every sequence's window at full context
twice over, and for branch ends every ``2 (W + B)`` cached tokens), at most 1. A ratio of 1,
or a window as long as the context, means one pool (the window layers counted in full).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Sequence


@dataclass(frozen=True, slots=True)
class PoolSplit:
    """``window_blocks`` 0: one pool (no window pool)."""

    main_blocks: int
    window_blocks: int = 0
    window: int = 0
    window_layers: tuple[int, ...] = ()
    ratio: float = 1.0

    @property
    def pooled(self) -> bool:
        return self.window_blocks > 0


def window_geometry(layer_windows: Sequence[int]) -> tuple[int, tuple[int, ...]] | None:
    """(W, the window layers) when some layers share one window W; None when no layer has a
    window or the windows differ (then every layer is counted in full)."""
    layers = tuple(i for i, w in enumerate(layer_windows) if w)
    sizes = {layer_windows[i] for i in layers}
    if len(sizes) != 1:
        return None
    return sizes.pop(), layers


AUTO_MIN_RATIO = 0.5


def auto_ratio(window: int, context: int, step_tokens: int) -> float:
    """``2 (W + step) / context``, at least ``AUTO_MIN_RATIO`` (the tree's branch ends need
    window data too: ``W + B`` tokens each), at most 1."""
    return min(1.0, max(AUTO_MIN_RATIO, 2 * (window + step_tokens) / max(context, 1)))


def min_window_blocks(window: int, step_tokens: int, block_size: int) -> int:
    """The fewest window blocks one sequence can run in: its window, one step, a block of
    slack at each end."""
    return math.ceil((window + step_tokens) / block_size) + 2


def split_pool(budget_bytes: int, layer_block_bytes: int, num_layers: int,
               layer_windows: Sequence[int], *, block_size: int, context: int,
               step_tokens: int, ratio: float = 0.0) -> PoolSplit:
    """The split of ``budget_bytes`` (``layer_block_bytes``: one layer's K/V of one block;
    ``ratio`` 0: auto). One pool when there is no single window, or it spans the context,
    or the ratio comes to 1."""
    whole = PoolSplit(budget_bytes // (layer_block_bytes * num_layers))
    geometry = window_geometry(layer_windows) if layer_windows else None
    if geometry is None:
        return whole
    window, layers = geometry
    if window >= context:
        return whole
    ratio = ratio or auto_ratio(window, context, step_tokens)
    if ratio >= 1.0:
        return whole
    num_global = num_layers - len(layers)
    least = min_window_blocks(window, step_tokens, block_size)
    if num_global == 0:                  # every layer windowed: main blocks cost nothing
        window_blocks = budget_bytes // (layer_block_bytes * len(layers))
        main_blocks = int(window_blocks / ratio)
    else:
        main_blocks = int(budget_bytes // (layer_block_bytes * (num_global + ratio * len(layers))))
        window_blocks = max(least, math.ceil(ratio * main_blocks))
        main_blocks = (budget_bytes - window_blocks * layer_block_bytes * len(layers)) // (
            layer_block_bytes * num_global)
    if window_blocks < least or window_blocks >= main_blocks:
        return whole
    return PoolSplit(main_blocks, window_blocks, window, layers, window_blocks / main_blocks)


def split_for_count(main_blocks: int, layer_windows: Sequence[int], *, block_size: int,
                    context: int, step_tokens: int, ratio: float = 0.0,
                    window_blocks: int | None = None) -> PoolSplit:
    """The split for a given main block count (an engine sized by ``num_blocks``):
    ``window_blocks`` when given, else the ratio's share (never below one sequence's need)."""
    geometry = window_geometry(layer_windows) if layer_windows else None
    if geometry is None or geometry[0] >= context:
        return PoolSplit(main_blocks)
    window, layers = geometry
    if window_blocks is None:
        ratio = ratio or auto_ratio(window, context, step_tokens)
        if ratio >= 1.0:
            return PoolSplit(main_blocks)
        window_blocks = max(min_window_blocks(window, step_tokens, block_size),
                            math.ceil(ratio * main_blocks))
    if window_blocks <= 0 or window_blocks >= main_blocks:
        return PoolSplit(main_blocks)
    return PoolSplit(main_blocks, window_blocks, window, layers, window_blocks / main_blocks)
