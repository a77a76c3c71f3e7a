"""Stateful property test: random requests, locks, pins, clock, eviction and flushes across
three namespaces, with ``check_integrity()`` and a holder recount after every step.

A simulated engine allocates blocks, writes "K/V" (the token id) into slots of blocks it
owns only, copies a shared partial block before extending it (copy-on-write), inserts its
prompt (moving its lock there), decodes, inserts prompt + output[:-1] and drops its
references. Every match re-reads the slot contents of the blocks it returns, so a block
handed out wrongly (stale, freed, overwritten) fails the run.

``RADIX_STATEFUL_EXAMPLES`` / ``RADIX_STATEFUL_STEPS`` raise the default budget; the
``slow``-marked variant runs many more steps.
"""

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixgate.kv import BlockPool, CreditParams, CreditPolicy, LRUPolicy, RadixTree

B = 4
NUM_BLOCKS = 40
NAMESPACES = st.sampled_from(["a", "b", "c"])
PREFIXES = [(), (1, 2, 3, 4, 5), (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11), (7, 7, 7),
            tuple(range(20, 46))]    # long enough for evictions to trim leaves
TOKENS = st.tuples(st.sampled_from(PREFIXES), st.lists(st.integers(1, 4), max_size=24)).map(
    lambda parts: list(parts[0]) + parts[1]).filter(bool)


def blocks_for(n_tokens: int) -> int:
    return -(-n_tokens // B)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Request:
    def __init__(self, namespace, tokens):
        self.namespace = namespace
        self.tokens = list(tokens)   # prompt, then sampled outputs
        self.computed = 0            # positions whose K/V is written
        self.table: list[int] = []   # one reference held per entry
        self.owned: set[int] = set() # blocks this request allocated (the only ones it writes)
        self.handle = None


# every eviction policy runs the same machine (small credits, so continuation and branch
# credits expire and reorder within a run)
POLICIES = {"credit": lambda: CreditPolicy(CreditParams(6, 3)), "lru": LRUPolicy}


class RadixMachine(RuleBasedStateMachine):
    policy = "credit"

    def __init__(self):
        super().__init__()
        self.clock = FakeClock()
        self.pool = BlockPool(NUM_BLOCKS, B)
        self.tree = RadixTree(self.pool, clock=self.clock, policy=POLICIES[self.policy]())
        self.slots: dict[int, list] = {}    # block -> token id written per slot
        self.running: list[Request] = []
        self.extra_locks = []
        self.inserted: list[tuple[str, list[int]]] = []   # what callers inserted, to pin

    # ---- the simulated engine ---------------------------------------------------------

    def allocate(self, n: int) -> list[int] | None:
        if self.pool.num_free() < n:
            self.tree.evict(n - self.pool.num_free())
        if self.pool.num_free() < n:
            return None
        blocks = self.pool.allocate(n)
        for block in blocks:
            self.slots[block] = [None] * B
        return blocks

    def check_contents(self, tokens, length, blocks):
        assert len(blocks) == blocks_for(length)
        for i in range(length):
            assert self.slots[blocks[i // B]][i % B] == tokens[i], f"position {i} reads stale K/V"

    def write(self, request: Request, upto: int) -> bool:
        """Compute K/V for positions [computed, upto) into blocks the request owns."""
        need = blocks_for(upto) - len(request.table)
        if need > 0:
            fresh = self.allocate(need)
            if fresh is None:
                return False
            request.table += fresh
            request.owned.update(fresh)
        for i in range(request.computed, upto):
            block = request.table[i // B]
            assert block in request.owned, "a request may only write blocks it allocated"
            self.slots[block][i % B] = request.tokens[i]
        request.computed = upto
        return True

    def release(self, request: Request) -> None:
        self.tree.unlock(request.handle)
        self.pool.decref_many(request.table)
        self.running.remove(request)

    @rule(namespace=NAMESPACES, tokens=TOKENS, first_output=st.integers(1, 4))
    def start_request(self, namespace, tokens, first_output):
        self._start(namespace, namespace, tokens, first_output)

    @rule(namespace=NAMESPACES, source=NAMESPACES, tokens=TOKENS, first_output=st.integers(1, 4))
    def start_request_reading_another_namespace(self, namespace, source, tokens, first_output):
        """As the engine does with the ``public`` namespace: read another namespace's
        blocks, then cache the prompt in one's own (two namespaces' nodes share blocks)."""
        self._start(namespace, source, tokens, first_output)

    def _start(self, namespace, source, tokens, first_output):
        match = self.tree.match(source, tokens)
        self.check_contents(tokens, match.length, match.blocks)
        request = Request(namespace, tokens)
        request.handle = match.handle
        self.running.append(request)
        reuse = min(match.length, len(tokens) - 1)
        keep = blocks_for(reuse)
        request.table = match.blocks[:keep]
        self.pool.decref_many(match.blocks[keep:])
        request.computed = reuse
        if reuse % B:  # copy-on-write of the shared partial block
            copy = self.allocate(1)
            if copy is None:
                return self.release(request)
            shared = request.table[-1]
            self.slots[copy[0]][: reuse % B] = self.slots[shared][: reuse % B]
            request.table[-1] = copy[0]
            request.owned.add(copy[0])
            self.pool.decref(shared)
        if not self.write(request, len(tokens)):
            return self.release(request)
        request.tokens.append(first_output)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 15))
    def insert_prompt_and_move_lock(self, i):
        request = self.running[i % len(self.running)]
        prompt = request.tokens[: request.computed]
        result = self.tree.insert(request.namespace, prompt, request.table, lock=True)
        self.inserted.append((request.namespace, prompt))
        assert 0 <= result.cached_before <= len(prompt)
        self.tree.unlock(request.handle)
        request.handle = result.handle
        check = self.tree.match(request.namespace, prompt)
        assert check.length == len(prompt)
        self.check_contents(prompt, check.length, check.blocks)
        self.tree.unlock(check.handle)
        self.pool.decref_many(check.blocks)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 15), token=st.integers(1, 4))
    def decode_step(self, i, token):
        request = self.running[i % len(self.running)]
        if self.write(request, len(request.tokens)):
            request.tokens.append(token)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 15))
    def finish_request(self, i):
        request = self.running[i % len(self.running)]
        done = request.tokens[: request.computed]      # prompt + output[:-1]
        self.tree.insert(request.namespace, done, request.table)
        self.inserted.append((request.namespace, done))
        self.release(request)

    # ---- the other callers of the tree -----------------------------------------------

    @rule(namespace=NAMESPACES, tokens=TOKENS)
    def lookup(self, namespace, tokens):
        match = self.tree.match(namespace, tokens)
        self.check_contents(tokens, match.length, match.blocks)
        self.tree.unlock(match.handle)
        self.pool.decref_many(match.blocks)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 15))
    def lock_again(self, i):
        handle = self.running[i % len(self.running)].handle
        self.tree.lock(handle)
        self.extra_locks.append(handle)

    @precondition(lambda self: self.extra_locks)
    @rule()
    def unlock_extra(self):
        self.tree.unlock(self.extra_locks.pop(0))

    @rule(n=st.one_of(st.integers(1, 2), st.integers(1, 12)))   # small n: leaves get trimmed
    def evict(self, n):
        now = self.clock()
        protected = [node for node in self.tree.pinned_nodes if node.pin.expiry > now]
        free_before = self.pool.num_free()
        freed = self.tree.evict(n)
        assert self.pool.num_free() - free_before == freed
        assert all(node.alive for node in protected), "an unexpired pin was evicted"

    @rule(namespace=NAMESPACES, tokens=TOKENS, ttl=st.sampled_from([1.0, 10.0, 100.0]),
          owner=st.sampled_from(["x", "y"]))
    def pin(self, namespace, tokens, ttl, owner):
        assert 0 <= self.tree.pin(namespace, tokens, ttl, owner) <= len(tokens)

    @precondition(lambda self: self.inserted)
    @rule(i=st.integers(0, 63), cut=st.integers(0, 3), ttl=st.sampled_from([1.0, 10.0, 100.0]))
    def pin_inserted(self, i, cut, ttl):
        namespace, tokens = self.inserted[-1 - i % len(self.inserted)]
        self.tree.pin(namespace, tokens[: max(1, len(tokens) - cut)], ttl, "x")

    @precondition(lambda self: self.inserted)
    @rule(i=st.integers(0, 63), cut=st.integers(0, 3))
    def expect_continuation(self, i, cut):
        namespace, tokens = self.inserted[-1 - i % len(self.inserted)]
        marked = self.tree.expect_continuation(namespace, tokens[: len(tokens) - cut])
        assert 0 <= marked <= len(tokens)

    @rule(namespace=NAMESPACES, tokens=TOKENS)
    def unpin(self, namespace, tokens):
        self.tree.unpin(namespace, tokens)

    @rule(dt=st.sampled_from([0.5, 5.0, 30.0]))
    def advance_clock(self, dt):
        self.clock.now += dt

    @rule(namespace=st.one_of(st.none(), NAMESPACES))
    def flush(self, namespace):
        free_before = self.pool.num_free()
        assert self.tree.flush(namespace) == self.pool.num_free() - free_before
        for ns in self.tree.namespaces.select(namespace):
            stack = [ns.root]
            while stack:
                node = stack.pop()
                assert node is ns.root or node.lock_ref > 0, "flush left an unlocked node"
                assert node.pin is None
                stack.extend(node.children.values())

    # ---- invariants ------------------------------------------------------------------

    @invariant()
    def integrity(self):
        tables = [request.table for request in self.running]
        self.tree.check_integrity(extra_holders=tables)
        held = set(self.tree.held_blocks()).union(*tables)
        assert self.pool.num_free() + len(held) == self.pool.num_blocks
        stats = self.tree.stats()
        assert stats.cached_tokens == stats.evictable_tokens + stats.locked_tokens

    def teardown(self):
        for request in list(self.running):
            self.release(request)
        for handle in self.extra_locks:
            self.tree.unlock(handle)
        self.tree.flush()
        self.tree.check_integrity()
        assert self.pool.num_free() == self.pool.num_blocks, "blocks leaked after everyone let go"


COMMON = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

DEFAULT = settings(max_examples=int(os.environ.get("RADIX_STATEFUL_EXAMPLES", 60)),
                   stateful_step_count=int(os.environ.get("RADIX_STATEFUL_STEPS", 40)), **COMMON)
LONG = settings(max_examples=1500, stateful_step_count=120, **COMMON)


def machine_for(policy: str, base=RadixMachine) -> type[RadixMachine]:
    return type(f"{base.__name__}_{policy}", (base,), {"policy": policy})


TestRadixStateMachine = machine_for("credit").TestCase
TestRadixStateMachine.settings = DEFAULT
TestRadixStateMachineLRU = machine_for("lru").TestCase
TestRadixStateMachineLRU.settings = DEFAULT
TestRadixStateMachineLong = pytest.mark.slow(machine_for("credit").TestCase)
TestRadixStateMachineLong.settings = LONG
TestRadixStateMachineLongLRU = pytest.mark.slow(machine_for("lru").TestCase)
TestRadixStateMachineLongLRU.settings = LONG
