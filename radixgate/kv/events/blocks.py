"""The tree's ``CacheEvent`` stream as vLLM-style KV events, addressed by content.

vLLM announces a full KV block by a chained hash over the token ids up to its end, never
by the block's id, so a router can index many engines' caches by content. ``BlockTracker``
turns the tree's node-level events into those block-level ones:

- ``BlockStored`` for every block that a new node makes *full* (all ``block_size`` slots of
  the path cached), with the chained hash of ``block_hash.py`` under the tree's namespace
  (``as_event_id``), the hash of the block before it (None at the namespace's root) and
  the block's token ids. A partial last block is never announced;
- ``BlockRemoved`` for the announced blocks an eviction, trim or flush takes out;
- ``AllBlocksCleared`` when the tracker starts over (an engine that starts or restarts);
- ``BlockRemoved`` with ``medium`` ``WINDOW_MEDIUM`` for announced blocks whose window-layer
  K/V the window pool let go (a model with sliding-window layers: the blocks stay cached for
  the global layers; a prefix ending within the window after them is not usable as it is).

The tracker remembers each announced block by ``(namespace, block id)`` (its hash, its
parent's hash and its token ids): only one node of a namespace holds a block as full (a
boundary block shared with a parent is partial for the parent), so a removal names exactly
what it announced, and ``snapshot()`` lists what is announced now (for a subscriber that
lost track: ``publisher.py`` answers a replay request with it). Pure Python; the records
and their wire form are ``wire.py``'s, the transport (ZMQ) ``publisher.py``'s.
"""
from __future__ import annotations

from array import array

from ..core.block_hash import as_event_id, block_hashes, root_hash
from ..core.events import CacheEvent
from .wire import WINDOW_MEDIUM, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


def hash_seed(model_name: str, kv_dtype: str, block_size: int) -> str:
    """What every block hash of an engine is seeded with: engines that share it compute the
    same K/V for the same tokens (same model, KV dtype and block layout)."""
    return f"{model_name}|{kv_dtype}|{block_size}"


def prompt_block_ids(seed: bytes | str, namespace: str, tokens, block_size: int) -> list[int]:
    """The event ids of the full blocks of ``tokens`` in ``namespace``: what a router
    looks up to find who caches a prompt's prefix (the same chain as ``BlockStored``)."""
    return [as_event_id(h) for h in block_hashes(root_hash(seed, namespace), tokens, block_size)]


class BlockTracker:
    """Converts ``CacheEvent``s into ``KVEvent``s (call ``convert`` in event order)."""

    def __init__(self, seed: bytes | str, block_size: int):
        self.seed = seed
        self.block_size = block_size
        # (namespace, block id) -> (event id, parent event id, packed token ids)
        self._announced: dict[tuple[str, int], tuple[int, int | None, bytes]] = {}
        self._namespaces: dict[int, set[str]] = {}    # block id -> namespaces announcing it
        self._windowless: set[tuple[str, int]] = set()   # announced, window K/V let go

    @property
    def num_announced(self) -> int:
        return len(self._announced)

    def clear(self) -> AllBlocksCleared:
        self._announced.clear()
        self._namespaces.clear()
        self._windowless.clear()
        return AllBlocksCleared()

    def convert(self, event: CacheEvent) -> KVEvent | None:
        if event.kind == "stored":
            return self._stored(event)
        if event.kind == "window_removed":
            return self._window_removed(event)
        return self._removed(event)

    def _window_removed(self, event: CacheEvent) -> BlockRemoved | None:
        ids = []
        for block in event.blocks:
            for namespace in self._namespaces.get(block, ()):
                key = (namespace, block)
                if key not in self._windowless:
                    self._windowless.add(key)
                    ids.append(self._announced[key][0])
        return BlockRemoved(tuple(ids), WINDOW_MEDIUM) if ids else None

    def _stored(self, event: CacheEvent) -> BlockStored | None:
        B = self.block_size
        first, end_full = event.start // B, event.end // B     # block indices [first, end_full)
        if first >= end_full or not event.tokens:
            return None         # no block of this node is full (or a partial-block swap)
        tokens = array("i")
        tokens.frombytes(event.tokens[:end_full * B * tokens.itemsize])
        chain = block_hashes(root_hash(self.seed, event.namespace), tokens, B)
        ids = [as_event_id(h) for h in chain[first:end_full]]
        parent = as_event_id(chain[first - 1]) if first else None
        width = B * tokens.itemsize
        for index, event_id, before in zip(range(first, end_full), ids, [parent] + ids):
            block = event.blocks[index - first]
            self._announced[(event.namespace, block)] = (
                event_id, before, event.tokens[index * width:(index + 1) * width])
            self._namespaces.setdefault(block, set()).add(event.namespace)
        return BlockStored(tuple(ids), parent, tuple(tokens[first * B:end_full * B]), B)

    def _removed(self, event: CacheEvent) -> BlockRemoved | None:
        ids = []
        for block in event.blocks:
            announced = self._announced.pop((event.namespace, block), None)
            if announced is not None:
                ids.append(announced[0])
                self._windowless.discard((event.namespace, block))
                spaces = self._namespaces[block]
                spaces.discard(event.namespace)
                if not spaces:
                    del self._namespaces[block]
        return BlockRemoved(tuple(ids)) if ids else None

    def snapshot(self) -> list[KVEvent]:
        """What a subscriber starting from nothing needs to know now: ``AllBlocksCleared``,
        then every announced block as ``BlockStored`` (a run of chained blocks in one event,
        each block after its parent, in the order they were announced)."""
        events: list[KVEvent] = [AllBlocksCleared()]
        run: list[int] = []
        run_parent: int | None = None
        tokens = array("i")
        for event_id, parent, packed in self._announced.values():
            if run and parent != run[-1]:
                events.append(BlockStored(tuple(run), run_parent, tuple(tokens), self.block_size))
                run, tokens = [], array("i")
            if not run:
                run_parent = parent
            run.append(event_id)
            tokens.frombytes(packed)
        if run:
            events.append(BlockStored(tuple(run), run_parent, tuple(tokens), self.block_size))
        if self._windowless:
            events.append(BlockRemoved(tuple(entry[0] for key, entry in self._announced.items()
                                             if key in self._windowless), WINDOW_MEDIUM))
        return events
