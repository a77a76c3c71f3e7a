"""Small caller-side helpers for radix tree tests: act like a request that caches a
prompt or hits it, dropping its own references afterwards."""


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
