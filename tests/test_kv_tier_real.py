"""The disk tier at the default model's real KV size (SmolLM2-135M: 30 layers, 3 KV heads
of 64, float32, 16-token blocks: 368 KiB a part per block). The tiny model's blocks are
below torch's parallel grain, so what only shows at real size is tested here."""
from __future__ import annotations

import os
import time

import pytest
import torch

from radixgate.runtime.kv_cache import KVCache
from radixgate.runtime.kv_tier import DiskBackend, KVTier

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
    runtime/cpu_threads.py). Both threads copy with numpy: no OS thread is added."""
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
