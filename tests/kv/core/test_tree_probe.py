"""``RadixTree.probe``: one read-only walk that ``match`` and ``freeable_blocks`` reuse while
the tree's version is unchanged; splits keep a probe valid, removals make it stale."""
from radixgate.kv import BlockPool, RadixTree
from tests.support.radix import cache

B = 4


def make_tree(num_blocks: int = 32):
    pool = BlockPool(num_blocks, B)
    return pool, RadixTree(pool)


def count_walks(tree) -> list[int]:
    calls = [0]
    walk = tree._walk

    def counting(*args):
        calls[0] += 1
        return walk(*args)

    tree._walk = counting
    return calls


def release(pool, tree, found):
    pool.decref_many(found.blocks)
    tree.unlock(found.handle)


def test_a_current_probe_is_matched_without_walking_again():
    pool, tree = make_tree()
    cache(pool, tree, list(range(10)))
    query = list(range(6)) + [99]
    walks = count_walks(tree)
    probe = tree.probe("ns", query)
    found = tree.match("ns", query, probe=probe)
    assert walks[0] == 1 and probe.length == found.length == 6
    assert found.blocks == [0, 1]                 # positions 0..5: blocks 0 and 1
    release(pool, tree, found)
    tree.check_integrity()


def test_a_probe_stays_valid_across_splits_of_its_path():
    pool, tree = make_tree()
    cache(pool, tree, list(range(12)))
    short, long = list(range(3)) + [50], list(range(9)) + [60]
    probe_short, probe_long = tree.probe("ns", short), tree.probe("ns", long)
    other = tree.match("ns", list(range(6)) + [70])          # splits [0,12) at 6
    walks = count_walks(tree)
    for query, probe, length in ((short, probe_short, 3), (long, probe_long, 9)):
        assert tree.freeable_blocks(probe) == tree.freeable_blocks(tree.probe("ns", query))
        found = tree.match("ns", query, probe=probe)
        assert found.length == length and found.handle.node.end == length
        release(pool, tree, found)
    assert walks[0] == 2                                      # the two fresh probes above
    release(pool, tree, other)
    tree.check_integrity()


def test_a_probe_made_before_an_eviction_is_not_reused():
    pool, tree = make_tree()
    cache(pool, tree, list(range(12)))
    probe = tree.probe("ns", list(range(12)))
    tree.evict(2)                                            # trims the leaf to [0, 4)
    assert probe.version != tree.version
    walks = count_walks(tree)
    found = tree.match("ns", probe.tokens, probe=probe)
    assert walks[0] == 1 and found.length == 4               # walked again: the right length
    release(pool, tree, found)
    tree.check_integrity()
