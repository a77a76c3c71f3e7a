"""TierIndex (radixgate/kv/tiers/index.py): runs over chained addresses, tails, the byte
budget with retention, namespace purges; and the record format's checks. The index is pure
Python (no torch)."""
from __future__ import annotations

import pytest

from radixgate.kv.core.block_hash import block_hashes, root_hash
from radixgate.kv.tiers.index import TierIndex, TierRecord, block_addresses
from radixgate.kv.tiers.disk.records import CorruptRecord, decode, encode_prefix

B = 4
SEED = b"model-fingerprint"


def store(index: TierIndex, namespace: str, tokens, start: int, end: int, nbytes: int = 10):
    for a in block_addresses(root_hash(SEED, namespace), tokens, start, end, B):
        index.add(TierRecord(a.digest, namespace, a.parent, a.count, nbytes, a.full))


def run_of(index: TierIndex, namespace: str, tokens, first_index: int = 0, also=None):
    root = root_hash(SEED, namespace)
    chain = block_hashes(root, tokens[:len(tokens) // B * B], B)
    return index.longest_run(chain, root, tokens, first_index, also=also)


def test_addresses_are_full_blocks_then_a_tail_with_its_count():
    tokens = list(range(10))
    addresses = block_addresses(root_hash(SEED, "ns"), tokens, 0, 10, B)
    assert [(a.index, a.count, a.full) for a in addresses] == [(0, 4, True), (1, 4, True),
                                                               (2, 2, False)]
    assert addresses[1].parent == addresses[0].digest
    assert addresses[2].parent == addresses[1].digest
    # a range that starts inside a block covers that whole block's index
    assert [a.index for a in block_addresses(root_hash(SEED, "ns"), tokens, 5, 10, B)] == [1, 2]


def test_a_run_extends_over_full_blocks_and_the_longest_matching_tail():
    index = TierIndex(10_000, B)
    tokens = list(range(20))
    store(index, "ns", tokens, 0, 10)              # blocks 0, 1 and a 2-token tail
    store(index, "ns", tokens, 8, 11)              # a 3-token tail of block 2 as well
    run = run_of(index, "ns", tokens)
    assert run.length == 11 and [r.count for r in run.records] == [4, 4, 3]
    assert run_of(index, "ns", tokens, first_index=1).records[0].count == 4
    diverging = tokens[:9] + [99] * 5              # the 3-token tail does not match; 1 does not exist
    assert run_of(index, "ns", diverging).length == 8
    assert run_of(index, "other", tokens) is None  # another namespace finds nothing
    assert run_of(index, "ns", [7] + tokens[1:]) is None


def test_a_run_mixes_stored_and_staged_records_and_takes_the_longer_tail():
    stored, staged = TierIndex(10_000, B), TierIndex(1 << 62, B)
    tokens = list(range(14))
    store(stored, "ns", tokens, 0, 4)             # block 0 written
    store(staged, "ns", tokens, 4, 8)             # block 1 staged
    store(stored, "ns", tokens, 8, 12)            # block 2 written
    store(stored, "ns", tokens, 12, 13)           # a 1-token tail written
    store(staged, "ns", tokens, 12, 14)           # a 2-token tail staged
    assert run_of(stored, "ns", tokens).length == 4          # the gap at block 1
    run = run_of(stored, "ns", tokens, also=staged)
    assert run.length == 14 and [r.count for r in run.records] == [4, 4, 4, 2]
    assert run_of(TierIndex(10, B), "ns", tokens, also=staged) is None   # block 0 missing


def test_the_budget_takes_unretained_least_recent_first_then_soonest_expiry():
    index = TierIndex(50, B)
    tokens = list(range(24))
    store(index, "ns", tokens, 0, 24)              # 6 records of 10 bytes: 10 over budget
    digests = list(index.records)
    index.retain(digests[:2], ttl_s=100, now=0)
    index.touch(digests[2], now=0)                 # most recently used now
    victims = index.victims(0, now=1)
    assert [v.digest for v in victims] == [digests[3]]
    assert [v.digest for v in index.victims(30, now=1)] == digests[3:] + [digests[2]]
    every = [v.digest for v in index.victims(60, now=1)]
    assert set(every) == set(digests)              # retained go last, when nothing else fits
    assert every[-2:] == digests[:2]
    assert index.victims(40, now=200)[0].digest == digests[0]   # retention over: plain LRU


def test_a_hit_re_arms_retention_and_a_purge_forgets_a_namespace():
    index = TierIndex(1000, B)
    store(index, "a", list(range(8)), 0, 8)
    store(index, "b", list(range(8)), 0, 8)
    digest = next(iter(index.records))
    index.retain([digest], ttl_s=10, now=0)
    index.touch(digest, now=8)
    assert index.retained(digest, now=15) and not index.retained(digest, now=19)
    removed = index.remove_space("a")
    assert len(removed) == 2 and not index.has_space("a") and index.has_space("b")
    assert index.nbytes == 20 and run_of(index, "a", list(range(8))) is None


def test_a_record_reads_back_only_with_its_own_address_fingerprint_and_checksum():
    payload = [memoryview(bytes(range(64))), memoryview(bytes(32))]
    prefix = encode_prefix(SEED[:16].ljust(16, b"\0"), b"d" * 16, b"p" * 16, 4, True, payload)
    data = prefix + b"".join(payload)
    fp = SEED[:16].ljust(16, b"\0")
    body, windowed = decode(data, fp, b"d" * 16, 4, 96)
    assert bytes(body) == b"".join(payload) and windowed
    tombstoned = encode_prefix(fp, b"d" * 16, b"p" * 16, 4, True, payload, windowed=False)
    assert decode(tombstoned + b"".join(payload), fp, b"d" * 16, 4, 96)[1] is False
    flipped = bytearray(data)
    flipped[-1] ^= 1
    for bad, args in ((flipped, (fp, b"d" * 16, 4, 96)), (data[:-3], (fp, b"d" * 16, 4, 96)),
                      (data, (b"x" * 16, b"d" * 16, 4, 96)), (data, (fp, b"e" * 16, 4, 96)),
                      (data, (fp, b"d" * 16, 3, 96))):
        with pytest.raises(CorruptRecord):
            decode(bad, *args)
