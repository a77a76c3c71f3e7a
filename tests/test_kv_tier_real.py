"""The disk tier at the default model's real KV size (SmolLM2-135M: 30 layers, 3 KV heads
of 64, float32, 16-token blocks: 368 KiB a part per block). The tiny model's blocks are
below torch's parallel grain, so what only shows at real size is tested here."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from radixgate.runtime.model.kv_cache import KVCache
from radixgate.kv import DiskTierConfig
from radixgate.kv.tiers.disk import DiskBackend, KVTier

BLOCK_SIZE = 16
FINGERPRINT = b"r" * 16


def os_threads() -> int:
    """This process's OS threads (OpenMP workers included, unlike ``threading``)."""
    return len(os.listdir("/proc/self/task"))


def real_size_kv(config, num_blocks: int = 8) -> KVCache:
    kv = KVCache(config.num_layers, num_blocks, BLOCK_SIZE, config.num_kv_heads,
                 config.head_dim, "float32")
    generator = torch.Generator().manual_seed(0)
    for part in kv.k + kv.v:
        part.copy_(torch.randn(part.shape, generator=generator))
    return kv


def wait_written(tier: KVTier, records: int, timeout_s: float = 60) -> None:
    stop = time.monotonic() + timeout_s
    while (tier.stats().staged_bytes or tier.stats().writes < records) \
            and time.monotonic() < stop:
        time.sleep(0.01)
    assert tier.stats().writes == records


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: torch never goes parallel")
def test_tier_threads_add_no_openmp_pool_across_a_tail_write_and_a_disk_load(tmp_path,
                                                                            real_model):
    """A torch copy of a real-size block goes parallel and gives the writer or loader
    thread an OpenMP pool of its own (which makes the engine's workers sleep between ops:
    radixgate/runtime/engine/cpu_threads.py). Both threads copy with numpy: no OS thread is added."""
    kept = torch.get_num_threads()
    torch.set_num_threads(max(2, kept))       # the tier threads would inherit a parallel count
    kv = real_size_kv(real_model.config)
    tier = KVTier(DiskBackend(tmp_path, FINGERPRINT), kv, FINGERPRINT, budget_bytes=1 << 28)
    try:
        tokens = list(range(100, 140))              # 2 full blocks and an 8-token tail
        expected = [part.clone() for part in kv.gather_blocks([0, 1, 2])]   # warms this thread
        before = os_threads()
        assert tier.spill("ns", tokens, 0, len(tokens), [0, 1, 2]) == 3
        wait_written(tier, 3)
        run = tier.find("ns", tokens, 0, tier.chain("ns", tokens))
        assert run is not None and [r.count for r in run.records] == [16, 16, 8]
        ticket = tier.load(run, [5, 6, 7])
        assert ticket.wait(60) and ticket.loaded == 3
        assert os_threads() == before
        loaded = kv.gather_blocks([5, 6, 7])
        for want, got in zip(expected, loaded):
            assert torch.equal(want[:2], got[:2]) and torch.equal(want[2, :, :8], got[2, :, :8])
        assert tier.stats().loaded_blocks == 3 and tier.stats().drops["corrupt"] == 0
    finally:
        tier.close()
        torch.set_num_threads(kept)


CRASHED_SERVER = """
import sys, time
from radixgate.runtime.engine.api import Breakpoint
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.model.loader import load_model
from radixgate.kv import DiskTierConfig
from tests.support.engine import engine_config
from tests.support.engine_compare import greedy
from tests.test_kv_tier_real import PINNED, PROMPTS, wait_settled
loaded = load_model(sys.argv[2], device="cpu", dtype="float32", weights_dtype="float32")
engine = Engine(loaded, engine_config(num_blocks=40, disk=DiskTierConfig(sys.argv[1], 0.5),
                                      adapt_threads=False)).start()
for tokens in PROMPTS:
    engine.generate(greedy(tokens, max_tokens=2, namespace="ns-a"))
engine.generate(greedy(PINNED, max_tokens=2, namespace="ns-pin",
                       breakpoints=(Breakpoint(len(PINNED), 3600.0),)))
wait_settled(engine)
print("ready", flush=True)
time.sleep(600)
"""
SHARED_HEAD = list(range(1000, 1100))          # 100 tokens every prompt starts with
PROMPTS = [SHARED_HEAD + list(range(5000 + 300 * k, 5200 + 300 * k)) for k in range(4)]
PINNED = list(range(20000, 20150))


def wait_settled(engine, timeout_s: float = 60) -> None:
    """Until nothing is staged and the writes stopped moving (the tier's stats)."""
    stop, last = time.monotonic() + timeout_s, -1
    while time.monotonic() < stop:
        stats = engine.request_snapshot().result(timeout=30).tier
        if not stats.staged_bytes and stats.writes == last:
            return
        last = stats.writes
        time.sleep(0.2)


def test_blocks_on_disk_before_a_kill_9_are_served_after_it_at_real_size(tmp_path, real_model,
                                                                        default_model_path):
    """Four 300-token prompts sharing a 100-token head through 40 blocks of the default
    model's KV (16-token blocks, 46 KiB a token): the first two are evicted to disk while
    the shared head stays in memory, hot. A 1h pin is set last. Then ``kill -9``: no
    shutdown, nothing persisted. The restarted server reads every evicted prompt and the
    pinned prefix from disk, with the answers of a cold run."""
    import subprocess
    import sys

    from radixgate.runtime.engine.engine import Engine
    from tests.support.engine import engine_config
    from tests.support.engine_compare import compare_greedy, greedy

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get(
        "PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CRASHED_SERVER, str(tmp_path),
                              str(default_model_path)], cwd=root, env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
    finally:
        child.kill()                                  # SIGKILL: no shutdown, no flush
        child.wait(30)
    restarted = Engine(real_model, engine_config(num_blocks=40,
                                                 disk=DiskTierConfig(str(tmp_path), 0.5),
                                                 record_logits=True,
                                                 adapt_threads=False)).start()
    cold = Engine(real_model, engine_config(num_blocks=40, record_logits=True,
                                            enable_prefix_cache=False,
                                            adapt_threads=False)).start()
    try:
        for tokens in PROMPTS[:2]:                    # evicted to disk before the kill
            got = restarted.generate(greedy(tokens, max_tokens=4, namespace="ns-a"))
            assert got.usage.cache_read_tokens == len(tokens) - 1
            ref = cold.generate(greedy(tokens, max_tokens=4, namespace="ns-a"))
            compare_greedy(restarted, got, cold, ref, 0.01)
        pinned = restarted.generate(greedy(PINNED, max_tokens=2, namespace="ns-pin"))
        assert pinned.usage.cache_read_tokens == len(PINNED) - 1     # written through
        assert restarted.request_snapshot().result(timeout=30).tier.drops["corrupt"] == 0
        restarted.check_integrity().result(timeout=30)
    finally:
        restarted.shutdown(grace_s=0)
        cold.shutdown(grace_s=0)


def test_the_weights_identity_survives_a_move_and_a_touch_but_not_other_weights(
        tmp_path, default_model_path):
    """The default GGUF copied elsewhere and touched is the same weights (the tier keeps
    its blocks); one changed byte in its header or in a sampled piece of its tensor data
    is other weights (a fine-tune changes nearly every piece; the embedding probe of
    model_fingerprint covers seeded random weights)."""
    import shutil

    from radixgate.runtime.model.fingerprint import SAMPLE_BYTES, SAMPLES, weights_identity

    original = weights_identity(str(default_model_path))
    moved = tmp_path / "elsewhere" / "model.gguf"
    moved.parent.mkdir()
    shutil.copyfile(default_model_path, moved)
    os.utime(moved, (1_000_000, 1_000_000))
    assert weights_identity(str(moved)) == original
    sampled = (moved.stat().st_size - SAMPLE_BYTES) * (SAMPLES // 2) // (SAMPLES - 1) + 100
    for offset in (sampled, 40):      # a byte of a sampled piece of tensor data; the header
        changed = tmp_path / f"changed-{offset}.gguf"
        shutil.copyfile(default_model_path, changed)
        with open(changed, "r+b") as out:
            out.seek(offset)
            byte = out.read(1)
            out.seek(offset)
            out.write(bytes([byte[0] ^ 0xFF]))
        assert weights_identity(str(changed)) != original


def native_threads() -> set[int]:
    """OS threads of this process that are not Python threads: OpenMP workers and the like."""
    import threading
    python = {t.native_id for t in threading.enumerate()}
    return {int(tid) for tid in os.listdir("/proc/self/task")} - python


@pytest.fixture(scope="module")
def served_model():
    """The default model as ``radixgate serve`` loads it (int4 weights, a Q8_0 embedding
    dequantized in torch)."""
    from radixgate.runtime.model.loader import load_model
    return load_model("default", max_model_len=2048)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: torch never goes parallel")
async def test_a_server_with_the_tier_adds_no_openmp_pool_beside_the_engine_s(tmp_path,
                                                                            served_model):
    """The gateway builds its engine on a long-lived executor thread; a torch op there
    that goes parallel (the fingerprint's embedding probe did, at the default model's
    size) leaves that thread an OpenMP pool for the server's life, and single-stream decode
    ran at 0.47x of tier off. With the tier on, after a spill and a disk load, the running
    server has started exactly the native threads it starts with the tier off: the engine's
    workers (threads of earlier tests ending meanwhile do not count)."""
    import httpx2 as httpx

    from tests.support.inproc import in_process_gateway
    from tests.support.server import tenant_key

    kept = torch.get_num_threads()
    torch.set_num_threads(max(2, kept))
    prompts = {name: [(k * 7919 + seed * 104729) % 48000 + 100 for k in range(800)]
               for seed, name in enumerate(("a", "b"))}
    added, reads = {}, {}
    try:
        for tier in (False, True):
            before = native_threads()
            cache = {"disk": {"dir": str(tmp_path / "kv"), "gb": 1}} if tier else {}
            async with in_process_gateway(tenants=("acme",), kv_cache_gb=0.05,
                                          max_model_len=2048, cache=cache,
                                          model=served_model) as (base_url, app):
                async with httpx.AsyncClient(base_url=base_url, timeout=300, headers={
                        "x-api-key": tenant_key("acme")}) as client:
                    for name in ("a", "b", "a"):          # b evicts a; a comes back
                        got = await client.post("/v1/completions", json={
                            "prompt": prompts[name], "max_tokens": 2, "temperature": 0})
                        assert got.status_code == 200, got.text
                    reads[tier] = got.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                added[tier] = len(native_threads() - before)  # new ones, while it serves
    finally:
        torch.set_num_threads(kept)
    assert reads[True] >= 768                                  # the second a: from disk
    assert added[True] == added[False], added
