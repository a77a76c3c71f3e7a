"""Small caller-side helpers for radix tree tests: act like a request that caches a
prompt or hits it, dropping its own references afterwards; a tree on a clock the test moves."""

from radixgate.kv import BlockPool, RadixTree


class FakeClock:
    """Seconds that pass only when a test adds to ``now``."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self):
        return self.now


def make_clocked_tree(num_blocks: int = 64, block_size: int = 4):
    """``(pool, tree, clock)``: a tree whose pins expire on ``clock``."""
    clock = FakeClock()
    pool = BlockPool(num_blocks, block_size)
    return pool, RadixTree(pool, clock=clock), clock


def cache(pool, tree, tokens, namespace="ns"):
    """Insert ``tokens`` with freshly allocated blocks; the tree keeps its references."""
    blocks = pool.allocate(-(-len(tokens) // pool.block_size))
    tree.insert(namespace, tokens, blocks)
    pool.decref_many(blocks)
    return blocks


def hit(pool, tree, tokens, namespace="ns"):
    """Match ``tokens`` (refreshing LRU time and pins), then release lock and references."""
    match = tree.match(namespace, tokens)
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
