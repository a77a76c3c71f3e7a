"""The KV disk tier through the engine (tiny model): evicted prefixes come back from disk
with the answers of a cold run, survive a restart, never cross a fingerprint or a
namespace, and faults (a damaged record, a full disk, a held or unusable folder) cost
reuse only. Every scenario ends with the integrity check."""
from __future__ import annotations

import asyncio
import errno
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from radixgate.runtime.engine.engine import Engine
from radixgate.kv import DiskTierConfig
from radixgate.kv.tiers.disk import TierFolderError
from tests.support.engine import engine_config, tiny_model
from tests.support.engine_compare import assert_clean, compare_greedy, greedy

LOGIT_TOL = 1e-3
NUM_BLOCKS = 40                     # 640 tokens of memory: three 300-token prompts evict
PROMPT = list(range(100, 400))      # 300 tokens: 18 full blocks and a 12-token tail
OTHERS = [list(range(1000 + k * 300, 1300 + k * 300)) for k in range(3)]


def start(folder, **fields) -> Engine:
    fields.setdefault("num_blocks", NUM_BLOCKS)
    disk = DiskTierConfig(str(folder), fields.pop("disk_gb", 0.01))
    # a fixed thread count, as the cold engine's, and the deterministic mode: a prefix read
    # from disk must give the cold answer's very bits (by tolerance the default mode once
    # read 2.4e-3 against 1e-3 under CI load: another thread count or path sums otherwise)
    fields.setdefault("adapt_threads", False)
    fields.setdefault("deterministic", True)
    return Engine(tiny_model(), engine_config(disk=disk, record_logits=True,
                                              **fields)).start()


@pytest.fixture(scope="module")
def cold():
    """Reference answers without any cache (another engine, nothing shared)."""
    engine = Engine(tiny_model(), engine_config(num_blocks=NUM_BLOCKS, record_logits=True,
                                                enable_prefix_cache=False,
                                                adapt_threads=False, deterministic=True)).start()
    yield engine
    engine.shutdown(grace_s=0)


def blocks_dir(folder) -> Path:
    """The record folder of the (one) model that used the tier folder ``folder``."""
    found = list(Path(folder).glob("models/*/blocks"))
    assert len(found) == 1, found
    return found[0]


def tier_stats(engine: Engine):
    return engine.request_snapshot().result(timeout=30).tier


def evict_prompt(engine: Engine) -> None:
    """Other prompts take the memory; the writer then has PROMPT's blocks on disk."""
    for tokens in OTHERS:
        engine.generate(greedy(tokens, max_tokens=2, namespace="ns-other"))
    wait_written(engine)


def where(engine: Engine, tokens, namespace: str = "ns-a") -> list[str]:
    from radixgate.kv.tiers.disk.glue import block_tiers
    core = engine.core
    return engine._command(block_tiers, core.tree, core.tier, namespace, tokens).result(30)


def on_disk(engine: Engine, tokens, namespace: str = "ns-a") -> int:
    """How many of the leading blocks of ``tokens`` the disk tier holds."""
    return sum("disk" in w or w == "both" for w in where(engine, tokens, namespace))


def wait_written(engine: Engine, timeout: float = 30) -> None:
    stop = time.monotonic() + timeout
    while tier_stats(engine).staged_bytes and time.monotonic() < stop:
        time.sleep(0.02)


def same_answer(engine, got, cold, tokens, namespace="ns-a"):
    ref = cold.generate(greedy(tokens, namespace=namespace))
    assert compare_greedy(engine, got, cold, ref, LOGIT_TOL, exact=True).compared > 0


def run_once_and_stop(tmp_path, **overrides):
    """Answers PROMPT in namespace ns-a on a fresh engine over ``tmp_path``'s tier and shuts
    it down (its blocks are then on disk); returns that answer."""
    engine = start(tmp_path, **overrides)
    try:
        return engine.generate(greedy(PROMPT, namespace="ns-a"))
    finally:
        engine.shutdown(grace_s=0)


def test_an_evicted_prefix_loads_back_from_disk_with_the_cold_answer(tmp_path, cold):
    engine = start(tmp_path)
    try:
        first = engine.generate(greedy(PROMPT, namespace="ns-a"))
        blocks = -(-len(PROMPT) // 16)
        assert where(engine, PROMPT) == ["memory"] * blocks
        evict_prompt(engine)
        assert tier_stats(engine).writes >= len(PROMPT) // 16
        assert where(engine, PROMPT) == ["disk"] * blocks
        got = engine.generate(greedy(PROMPT, namespace="ns-a"))
        assert where(engine, PROMPT) == ["both"] * blocks
        assert first.usage.cache_read_tokens == 0
        assert got.usage.cache_read_tokens == len(PROMPT) - 1     # all but the last token
        snap = engine.request_snapshot().result(timeout=30)
        assert snap.hit_tokens["disk"] == len(PROMPT) - 1
        assert snap.tier.loaded_blocks == -(-len(PROMPT) // 16)  # 18 full blocks + the tail
        same_answer(engine, got, cold, PROMPT)
        assert got.output_token_ids == first.output_token_ids
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_blocks_evicted_before_the_writer_stores_them_are_served_from_staging(tmp_path,
                                                                             cold):
    engine = start(tmp_path)
    backend = engine.core.tier.backend
    gate = threading.Event()
    put = backend.put
    backend.put = lambda *args: (gate.wait(60), put(*args))      # a disk that lags behind
    try:
        first = engine.generate(greedy(PROMPT, namespace="ns-a"))
        for tokens in OTHERS:
            engine.generate(greedy(tokens, max_tokens=2, namespace="ns-other"))
        stats = tier_stats(engine)
        assert stats.writes == 0 and stats.staged_bytes > 0
        assert where(engine, PROMPT) == ["disk"] * -(-len(PROMPT) // 16)
        got = engine.generate(greedy(PROMPT, namespace="ns-a"))
        assert got.usage.cache_read_tokens == len(PROMPT) - 1
        assert tier_stats(engine).writes == 0                  # served from the copies
        assert got.output_token_ids == first.output_token_ids
        same_answer(engine, got, cold, PROMPT)
        engine.generate(greedy(OTHERS[0], max_tokens=2, namespace="ns-other"))
        engine.flush("ns-other").result(timeout=30)       # staged, then flushed: gone
        assert where(engine, OTHERS[0], "ns-other") == []
        gate.set()
        wait_written(engine)
        assert tier_stats(engine).staged_bytes == 0
        assert where(engine, OTHERS[0], "ns-other") == []
        assert_clean(engine)
    finally:
        gate.set()
        engine.shutdown(grace_s=0)


def test_a_restarted_server_serves_known_prefixes_from_disk(tmp_path, cold):
    first = run_once_and_stop(tmp_path)         # the tree's content is kept at shutdown
    files = [p for p in blocks_dir(tmp_path).rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    engine = start(tmp_path)
    try:
        assert tier_stats(engine).blocks == len(files)
        got = engine.generate(greedy(PROMPT, namespace="ns-a"))
        assert got.usage.cache_read_tokens == len(PROMPT) - 1
        assert got.output_token_ids == first.output_token_ids
        same_answer(engine, got, cold, PROMPT)
        other_ns = engine.generate(greedy(PROMPT, namespace="ns-b"))
        assert other_ns.usage.cache_read_tokens == 0          # the namespace is in the key
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_another_fingerprint_reads_nothing(tmp_path, cold):
    run_once_and_stop(tmp_path)
    engine = start(tmp_path, kv_dtype="float16")       # another KV layout: other addresses
    try:
        assert tier_stats(engine).blocks == 0
        got = engine.generate(greedy(PROMPT, namespace="ns-a"))
        assert got.usage.cache_read_tokens == 0
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_a_damaged_record_is_dropped_and_never_served(tmp_path, cold):
    run_once_and_stop(tmp_path)
    records = sorted(blocks_dir(tmp_path).rglob("*.f"), key=lambda p: p.stat().st_mtime)
    victim = records[len(records) // 2]
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF                                     # one flipped bit in the payload
    victim.write_bytes(bytes(data))
    torn = records[-1]
    torn.write_bytes(torn.read_bytes()[:100])            # a torn write
    leftover = victim.with_name(victim.name + ".tmp")    # a kill -9 during a write
    leftover.write_bytes(b"half a record")
    engine = start(tmp_path)
    assert not leftover.exists()
    try:
        got = engine.generate(greedy(PROMPT, namespace="ns-a"))
        stats = tier_stats(engine)
        assert stats.drops["corrupt"] >= 1 and not victim.exists()
        assert 0 < got.usage.cache_read_tokens < len(PROMPT) - 1   # the run ends before it
        same_answer(engine, got, cold, PROMPT)
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_the_disk_budget_evicts_least_recently_used_blocks(tmp_path):
    """A, B, C (25 records each) through a memory of one prompt and a disk of about 60
    records: A, then B, go to disk; A is read back (its records touched), so when C's
    eviction needs room the least recently used records are B's, not the older A's."""
    budget_gb = 60 * 8300 / 2**30                # about 60 records of the tiny model's float32 KV
    engine = start(tmp_path, disk_gb=budget_gb, kv_dtype="float32")
    a, b, c = (list(range(3000 + k * 400, 3400 + k * 400)) for k in range(3))
    try:
        for tokens in (a, b, c):                         # A and B spilled: 50 records
            engine.generate(greedy(tokens, max_tokens=2, namespace="ns-a"))
        wait_written(engine)
        assert on_disk(engine, a) == on_disk(engine, b) == 25
        assert engine.generate(greedy(a, max_tokens=2, namespace="ns-a")
                               ).usage.cache_read_tokens >= 384        # A loaded, C spilled
        wait_written(engine)
        stats = tier_stats(engine)
        assert stats.evicted > 0 and stats.bytes <= stats.budget_bytes
        assert on_disk(engine, b) == 0                   # the least recently used: gone
        assert on_disk(engine, a) == on_disk(engine, c) == 25     # touched / newest: kept
        file_bytes = sum(p.stat().st_size for p in blocks_dir(tmp_path).rglob("*") if p.is_file())
        assert file_bytes == stats.bytes
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_another_model_keeps_its_blocks_in_its_own_subfolder_within_one_budget(tmp_path,
                                                                               cold):
    """Another KV dtype (another fingerprint) gets its own subfolder; the first model's
    blocks are still served when it comes back. Both share one budget: when the second
    needs room, the least recently used model's blocks go first."""
    run_once_and_stop(tmp_path)                                     # float32 KV: model A
    run_once_and_stop(tmp_path, kv_dtype="float16")                 # model B: its own folder
    models = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert len(models) == 2
    engine = start(tmp_path)
    try:
        got = engine.generate(greedy(PROMPT, namespace="ns-a"))
        assert got.usage.cache_read_tokens == len(PROMPT) - 1          # A's blocks kept
        same_answer(engine, got, cold, PROMPT)
    finally:
        engine.shutdown(grace_s=0)
    one_model = sum(p.stat().st_size for p in tmp_path.glob("models/*/blocks/*/*"))
    engine = start(tmp_path, kv_dtype="float16", disk_gb=one_model * 1.25 / 2**30)
    try:                   # A (1.0) + B (0.5, half the bytes) > 1.25: A goes at B's next write
        for tokens in OTHERS:
            engine.generate(greedy(tokens, max_tokens=2, namespace="ns-b"))
        wait_written(engine)
        assert len(list((tmp_path / "models").iterdir())) == 1
        assert on_disk(engine, PROMPT) == 19                           # B's own blocks stay
        assert tier_stats(engine).evicted == 0
    finally:
        engine.shutdown(grace_s=0)


def test_leftover_temporary_files_are_removed_at_start(tmp_path):
    run_once_and_stop(tmp_path)
    model = next((tmp_path / "models").iterdir())
    leftovers = [tmp_path / "tier.json.77.123.tmp", model / "tier.json.77.124.tmp",
                 model / "retention.json.77.125.tmp", next(blocks_dir(tmp_path).iterdir())
                 / "00ff.f.tmp"]
    for path in leftovers:
        path.write_bytes(b"half a write")
    start(tmp_path).shutdown(grace_s=0)
    assert [p for p in leftovers if p.exists()] == []


def test_a_full_disk_stops_writes_and_the_server_keeps_serving(tmp_path, cold, caplog):
    engine = start(tmp_path)
    backend = engine.core.tier.backend

    def no_space(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    backend.put = no_space
    try:
        engine.generate(greedy(PROMPT, namespace="ns-a"))
        evict_prompt(engine)
        stats = tier_stats(engine)
        assert stats.full and stats.drops["disk_full"] > 0 and stats.writes == 0
        assert "disk is full" in caplog.text
        got = engine.generate(greedy(PROMPT, namespace="ns-a"))
        assert got.usage.cache_read_tokens == 0              # recomputed, same answer
        same_answer(engine, got, cold, PROMPT)
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_a_second_server_on_the_same_folder_is_refused(tmp_path):
    engine = start(tmp_path)
    try:
        with pytest.raises(TierFolderError, match="in use by another radixgate server"):
            start(tmp_path)
        from radixgate.kv import CacheConfig
        from radixgate.kv.tiers.disk import check_disk_folder
        with pytest.raises(TierFolderError, match=f"pid {os.getpid()}"):
            check_disk_folder(CacheConfig(disk=DiskTierConfig(str(tmp_path), 1)))
        start_sub = start(tmp_path / "replica-1")            # a replica's own subfolder
        start_sub.shutdown(grace_s=0)
    finally:
        engine.shutdown(grace_s=0)
    start(tmp_path).shutdown(grace_s=0)                      # free again once closed


def test_an_unusable_folder_is_a_clear_error_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(TierFolderError, match="cannot be used"):
        start(blocker / "kv")
    from radixgate.kv import CacheConfig
    from radixgate.kv.tiers.disk import check_disk_folder
    with pytest.raises(TierFolderError, match="cannot be used"):
        check_disk_folder(CacheConfig(disk=DiskTierConfig(str(blocker / "kv"), 1)))
    check_disk_folder(CacheConfig(disk=DiskTierConfig(str(tmp_path / "fine"), 1)))


def test_a_flush_purges_the_namespace_on_disk(tmp_path):
    engine = start(tmp_path)
    try:
        engine.generate(greedy(PROMPT, namespace="ns-a"))
        engine.generate(greedy(PROMPT, namespace="ns-b"))
        evict_prompt(engine)
        engine.flush("ns-a").result(timeout=30)
        wait_written(engine)
        got_a = engine.generate(greedy(PROMPT, namespace="ns-a"))
        got_b = engine.generate(greedy(PROMPT, namespace="ns-b"))
        assert got_a.usage.cache_read_tokens == 0
        assert got_b.usage.cache_read_tokens == len(PROMPT) - 1
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_a_request_aborted_while_loading_frees_its_blocks(tmp_path):
    engine = start(tmp_path)
    try:
        engine.generate(greedy(PROMPT, namespace="ns-a"))
        evict_prompt(engine)
        backend = engine.core.tier.backend
        reading, release = threading.Event(), threading.Event()
        read = backend.read

        def slow_read(record):
            reading.set()
            release.wait(30)
            return read(record)

        backend.read = slow_read
        future = engine.submit_future(greedy(PROMPT, namespace="ns-a", request_id="slow"))
        assert reading.wait(30)
        other = engine.generate(greedy(OTHERS[0], max_tokens=2, namespace="ns-c"), timeout=60)
        assert other.usage.prompt_tokens == len(OTHERS[0])    # others run while it loads
        aborted = engine.abort("slow")
        time.sleep(0.05)
        release.set()
        assert aborted.result(timeout=30) is True
        assert future.result(timeout=30).reason.value == "aborted"
        backend.read = read
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_files_are_private_to_the_server_user(tmp_path):
    """Every folder of the tier (the tier folder and the parents it created included) is
    0700, a folder that existed with a wider mode too, and every file 0600."""
    existing = tmp_path / "existing"
    (existing / "models").mkdir(parents=True, mode=0o755)
    os.chmod(existing, 0o755)
    os.chmod(existing / "models", 0o755)
    created = tmp_path / "new" / "parent" / "kv"
    for folder in (existing, created):
        run_once_and_stop(folder)
    paths = [p for folder in (existing, created) for p in [folder, *folder.rglob("*")]]
    paths += [tmp_path / "new", tmp_path / "new" / "parent"]
    folders = [p for p in paths if p.is_dir()]
    files = [p for p in paths if p.is_file()]
    assert len(folders) >= 2 * 4 + 2 and len(files) > 10
    assert {p: oct(stat.S_IMODE(p.stat().st_mode)) for p in folders
            if stat.S_IMODE(p.stat().st_mode) != 0o700} == {}
    assert {p: oct(stat.S_IMODE(p.stat().st_mode)) for p in files
            if stat.S_IMODE(p.stat().st_mode) != 0o600} == {}


async def test_stats_metrics_and_usage_show_the_disk_tier_over_http(tmp_path):
    """A prompt evicted from a tiny memory budget comes back from disk: its usage counts the
    disk hit as cache reads; /v1/cache/stats and /metrics show both tiers (admin)."""
    import aiohttp

    from tests.support import client as c
    from tests.support.inproc import engine_of, in_process_gateway
    from tests.support.server import ADMIN_KEY, tenant_key

    acme = c.headers(tenant_key("acme"))
    system = " ".join(f"rule{i} keeps answers short" for i in range(40))
    async with in_process_gateway(tenants=("acme",), kv_cache_gb=0.0004,
                                  cache={"disk": {"dir": str(tmp_path), "gb": 0.01},
                                         "kv_dtype": "float32"}
                                  ) as (base, app):
        async with aiohttp.ClientSession(base) as http:
            body = c.anthropic_body("first question", system=system, max_tokens=2)
            first = await (await http.post(c.ANTHROPIC_PATH, headers=acme, json=body)).json()
            for k in range(4):                         # other prompts take the memory
                other = c.anthropic_body(f"other {k} " + system.replace("rule", f"x{k}"),
                                         max_tokens=2)
                assert (await http.post(c.ANTHROPIC_PATH, headers=acme, json=other)).status == 200
            await asyncio.sleep(0.3)                   # the writer catches up
            again = await (await http.post(c.ANTHROPIC_PATH, headers=acme, json=body)).json()
            assert first["usage"]["cache_read_input_tokens"] == 0
            assert again["usage"]["cache_read_input_tokens"] > 0.9 * first["usage"]["input_tokens"]
            assert again["content"] == first["content"]
            _, stats = await c.get_json(http, base + "/v1/cache/stats", ADMIN_KEY)
            disk = stats["tiers"]["disk"]
            assert disk["enabled"] and disk["hit_tokens"] > 0 and disk["loads"] == 1
            assert disk["writes"] > 0 and disk["bytes"] > 0 and not disk["full"]
            assert stats["tiers"]["memory"]["blocks"] > 0
            _, mine = await c.get_json(http, base + "/v1/cache/stats", tenant_key("acme"))
            assert mine["tiers"]["disk"]["hit_tokens"] == 0 and mine["tiers"]["disk"]["enabled"]
            text = await (await http.get("/metrics", headers=c.headers(ADMIN_KEY))).text()
            assert 'radixgate_kv_tier_hit_tokens_total{tier="disk"}' in text
            assert 'radixgate_kv_tier_blocks{tier="disk"}' in text
            assert "radixgate_kv_tier_disk_full 0.0" in text
            assert 'radixgate_kv_tier_drops_total{reason="disk_full"} 0.0' in text
        assert_clean(engine_of(app))


def test_pinned_prefixes_stay_in_the_tier_for_their_ttl_when_the_budget_is_short():
    """Host-memory backend, same tier code: a retained prefix outlives LRU pressure; and
    loading it back gives the bytes that were spilled."""
    import torch

    from radixgate.runtime.model.kv_cache import KVCache
    from radixgate.kv.tiers.disk import KVTier, MemoryBackend

    kv = KVCache(2, 64, 4, 2, 8, "float32")
    for part in kv.block_parts():
        part.copy_(torch.randint(0, 255, part.shape, dtype=torch.uint8))
    tier = KVTier(MemoryBackend(), kv, b"f" * 16, budget_bytes=10 * 1000, kind="memory")
    record = tier.record_bytes(4)                      # 512 payload bytes + the prefix
    tier.index.budget_bytes = 6 * record               # room for six blocks
    pinned = list(range(16))                           # 4 blocks
    try:
        tier.retain("ns", pinned, ttl_s=3600)
        tier.spill("ns", pinned, 0, 16, [0, 1, 2, 3])
        for k in range(5):                             # 20 more blocks push the budget
            tokens = list(range(100 * (k + 1), 100 * (k + 1) + 16))
            tier.spill("ns", tokens, 0, 16, [4 + 4 * k + i for i in range(4)])
        tier.close()
        stats = tier.stats()
        assert stats.evicted > 0 and stats.bytes <= 6 * record
        chain = tier.chain("ns", pinned)
        assert all(digest in tier.index for digest in chain)    # the pinned prefix stayed
        expected = [part[:, 0:4].clone() for part in kv.block_parts()]
        tier2 = KVTier(tier.backend, kv, b"f" * 16, budget_bytes=10 * 1000, kind="memory")
        tier2.index = tier.index
        run = tier2.find("ns", pinned, 0, chain)
        ticket = tier2.load(run, [40, 41, 42, 43])
        assert ticket.wait(10) and ticket.loaded == 4 and ticket.length == 16
        for want, part in zip(expected, kv.block_parts()):
            assert torch.equal(part[:, 40:44], want)
        tier2.close()
    finally:
        tier.close()


def test_a_24h_breakpoint_holds_memory_at_most_an_hour_and_the_tier_for_a_day(tmp_path):
    from radixgate.runtime.engine.api import Breakpoint

    engine = start(tmp_path)
    try:
        engine.generate(greedy(PROMPT, namespace="ns-a",
                               breakpoints=(Breakpoint(len(PROMPT), 86400.0),)))
        snap = engine.request_snapshot().result(timeout=30)
        assert snap.pins and 3500 < snap.pins[0].pin_ttl_s <= 3600
        index = engine.core.tier.index
        chain = engine.core.tier.chain("ns-a", PROMPT)
        now = time.time()
        assert all(index.retained(d, now + 80000) for d in chain)
        assert not index.retained(chain[0], now + 90000)
        assert engine.unpin("ns-a", PROMPT).result(timeout=30)
        assert not any(index.retained(d, now) for d in chain)
        assert engine.pin("ns-a", PROMPT, 7200.0, "admin").result(timeout=30) == len(PROMPT)
        snap = engine.request_snapshot().result(timeout=30)
        assert snap.pins[0].pin_ttl_s <= 3600 and index.retained(chain[-1], now + 7000)
    finally:
        engine.shutdown(grace_s=0)


def test_a_spill_beyond_the_staging_room_keeps_what_fits_and_never_waits():
    from radixgate.runtime.model.kv_cache import KVCache
    from radixgate.kv.tiers.disk import KVTier, MemoryBackend

    kv = KVCache(2, 32, 4, 2, 8, "float32")
    backend = MemoryBackend()
    gate = threading.Event()
    put = backend.put
    backend.put = lambda *args: (gate.wait(30), put(*args))
    tier = KVTier(backend, kv, b"f" * 16, budget_bytes=1 << 20, kind="memory",
                  staging_bytes=1500)                  # room for one record (1,072 bytes)
    try:
        started = time.monotonic()
        staged = tier.spill("ns", list(range(16)), 0, 16, [0, 1, 2, 3])
        assert time.monotonic() - started < 5            # the writer is stuck: no waiting
        assert staged == 1 and tier.stats().drops["backlog"] == 3
        gate.set()
        assert tier.spill("ns", list(range(16)), 0, 16, [0, 1, 2, 3], wait=True) == 3
        tier.close()
        assert tier.stats().writes == 4 and len(backend.data) == 4
    finally:
        gate.set()
        tier.close()


KILLED_WRITER = """
import sys, time
from radixgate.kv import DiskTierConfig
from radixgate.runtime.engine.engine import Engine
from tests.support.engine import engine_config, tiny_model
from tests.support.engine_compare import greedy
engine = Engine(tiny_model(), engine_config(num_blocks=40,
                                            disk=DiskTierConfig(sys.argv[1], 0.01),
                                            adapt_threads=False,
                                            deterministic=True)).start()
k, ready = 0, False
while True:
    engine.generate(greedy(list(range(2000 + 300 * k, 2300 + 300 * k)), max_tokens=2,
                           namespace="ns-a"))
    k += 1
    if not ready and k >= 4 and engine.request_snapshot().result(timeout=30).tier.blocks > 0:
        ready = print("ready", flush=True) or True     # some blocks are on disk already
"""


def test_kill_9_while_writing_loses_only_unwritten_blocks_and_never_serves_wrong_kv(
        tmp_path, cold):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get(
        "PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=root,
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.3)                               # mid-stream of evictions and writes
    finally:
        child.kill()                                  # SIGKILL: no shutdown, no flush
        child.wait(30)
    engine = start(tmp_path)                          # the dead server's lock is gone
    try:
        assert tier_stats(engine).blocks > 0
        reused = 0
        for k in range(4):
            tokens = list(range(2000 + 300 * k, 2300 + 300 * k))
            got = engine.generate(greedy(tokens, namespace="ns-a"))
            reused += got.usage.cache_read_tokens
            same_answer(engine, got, cold, tokens)
        assert reused > 0 and tier_stats(engine).drops["corrupt"] == 0
        assert not list(blocks_dir(tmp_path).rglob("*.tmp"))
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_random_prefix_traffic_through_a_small_memory_and_the_tier_answers_as_cold(
        tmp_path, cold):
    """Prompts sharing prefixes of every alignment (ends inside blocks, tails on disk,
    memory matches ending mid-block), sent in bursts so loads overlap other requests'
    compute: every answer is the cold one and integrity holds."""
    import random

    from tests.support.engine_compare import generate_all

    rng = random.Random(7)
    bases = [[rng.randrange(50, 5000) for _ in range(rng.randrange(40, 260))] for _ in range(5)]
    engine = start(tmp_path, num_blocks=48)
    try:
        for burst in range(6):
            prompts = []
            for _ in range(4):
                base = rng.choice(bases)
                cut = rng.randrange(len(base) // 2, len(base) + 1)
                prompts.append(base[:cut] + [rng.randrange(50, 5000)
                                             for _ in range(rng.randrange(1, 40))])
            results = generate_all(engine, [greedy(p, namespace="ns-a") for p in prompts])
            for prompt, got in zip(prompts, results):
                same_answer(engine, got, cold, prompt)
        # whether the bursts' own evictions came back from disk depends on how their
        # requests interleave; a last burst after the bases were pushed out always does
        evict_prompt(engine)
        prompts = [base + [rng.randrange(50, 5000)] for base in bases[:4]]
        results = generate_all(engine, [greedy(p, namespace="ns-a") for p in prompts])
        for prompt, got in zip(prompts, results):
            same_answer(engine, got, cold, prompt)
        assert tier_stats(engine).hit_tokens > 0
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_serve_refuses_a_held_tier_folder_before_loading_anything(tmp_path, capsys):
    from radixgate.gateway.cli import main

    engine = start(tmp_path)
    try:
        assert main(["serve", "--tiny", "--kv-disk-dir", str(tmp_path), "--kv-disk-gb", "1"]) == 2
        assert "in use by another radixgate server" in capsys.readouterr().err
    finally:
        engine.shutdown(grace_s=0)


def test_a_folder_of_the_flat_layout_moves_into_its_model_subfolder(tmp_path, cold):
    """A tier folder written before per-model subfolders (DIR/tier.json, DIR/blocks) is
    adopted by the same model: its blocks are served, now from DIR/models/FP."""
    run_once_and_stop(tmp_path)
    model = next((tmp_path / "models").iterdir())
    os.replace(model / "blocks", tmp_path / "blocks")
    os.replace(model / "tier.json", tmp_path / "tier.json")
    for leftover in model.iterdir():
        leftover.unlink()
    model.rmdir()
    (tmp_path / "models").rmdir()
    engine = start(tmp_path)
    try:
        got = engine.generate(greedy(PROMPT, namespace="ns-a"))
        assert got.usage.cache_read_tokens == len(PROMPT) - 1
        same_answer(engine, got, cold, PROMPT)
        assert not (tmp_path / "blocks").exists() and not (tmp_path / "tier.json").exists()
        assert blocks_dir(tmp_path).parent.name == model.name
    finally:
        engine.shutdown(grace_s=0)
