"""Chained block hashes: equal exactly for equal (seed, namespace, token prefix)."""
from hypothesis import given, strategies as st

from radixgate.kv.core.block_hash import as_event_id, block_hashes, root_hash, tail_hash

TOKENS = st.lists(st.integers(0, 49151), max_size=80)


@given(TOKENS, TOKENS)
def test_hashes_agree_exactly_on_shared_full_blocks(a, b):
    root = root_hash(b"model", "tenant-a")
    ha, hb = block_hashes(root, a, 8), block_hashes(root, b, 8)
    for j, (x, y) in enumerate(zip(ha, hb)):
        assert (x == y) == (a[:(j + 1) * 8] == b[:(j + 1) * 8])
    assert len(ha) == len(a) // 8


def test_chain_continues_from_a_parent():
    root = root_hash("m", "ns")
    tokens = list(range(40))
    whole = block_hashes(root, tokens, 8)
    assert block_hashes(whole[1], tokens[16:], 8) == whole[2:]


def test_namespace_and_seed_separate_addresses():
    tokens = list(range(16))
    base = block_hashes(root_hash("m", "a"), tokens, 16)
    assert base != block_hashes(root_hash("m", "b"), tokens, 16)
    assert base != block_hashes(root_hash("m2", "a"), tokens, 16)


def test_tail_hash_depends_on_count_and_is_not_a_full_block():
    root = root_hash("m", "ns")
    assert tail_hash(root, [1, 2]) != tail_hash(root, [1, 2, 0])
    assert tail_hash(root, list(range(8))) != block_hashes(root, list(range(8)), 8)[0]
    assert -(1 << 63) <= as_event_id(tail_hash(root, [5])) < (1 << 63)
