"""QueryPacker: packed bytes are always those of the tokens passed, memo or not."""

import struct
from array import array

from radixgate.kv import BlockPool, RadixTree
from radixgate.kv.core.packing import QueryPacker


def packed(tokens):
    return struct.pack(f"{len(tokens)}i", *tokens)


def test_packer_reuses_remembered_prefix_and_extends_it():
    packer = QueryPacker()
    prompt = list(range(300, 340))
    assert packer.pack(prompt) == packed(prompt)
    longer = prompt + [7, 8, 9]
    assert packer.pack(longer) == packed(longer)
    assert packer.pack(prompt[:10]) == packed(prompt[:10])


def test_packer_sees_in_place_mutation():
    packer = QueryPacker()
    tokens = [1000 + i for i in range(64)]
    packer.pack(tokens)
    tokens[20] = 5
    assert packer.pack(tokens) == packed(tokens)
    tokens[63] = 6
    assert packer.pack(tokens[:40]) == packed(tokens[:40])


def test_packer_handles_tuples_arrays_and_empty():
    packer = QueryPacker(size=2)
    assert packer.pack((1, 2, 3)) == packed([1, 2, 3])
    assert packer.pack(array("i", [4, 5])) == packed([4, 5])
    assert packer.pack([]) == b""
    for i in range(5):                       # beyond the memo size: still exact
        assert packer.pack([i, i + 1, i + 2]) == packed([i, i + 1, i + 2])


def test_tree_matches_mutated_list_by_its_current_tokens():
    pool = BlockPool(16, 4)
    tree = RadixTree(pool)
    tokens = [100, 101, 102, 103, 104, 105]
    blocks = pool.allocate(2)
    tree.insert("ns", tokens, blocks)
    tokens[2] = 999
    match = tree.match("ns", tokens)
    assert match.length == 2
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    tree.check_integrity([blocks])
