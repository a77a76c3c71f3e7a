"""benchmarks/kernels_bench.py: the GPU section's logic run on tiny shapes (under the Triton
interpreter when there is no GPU) with a fixed fake timer, and the peak-bandwidth table."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton", reason="triton is not installed")

from benchmarks.kernels_bench import GpuSizes, gpu_rows, markdown_table, peak_gbps_for  # noqa: E402

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def _fixed_timer(fn) -> float:
    fn()          # every timed callable still runs once
    return 2.0    # ms


@pytest.mark.parametrize("name,peak", [("NVIDIA H200", 4800), ("NVIDIA H100 80GB HBM3", 3350),
                                       ("NVIDIA A100-SXM4-80GB", 2039), ("NVIDIA H100 PCIe", 2000),
                                       ("Some Future GPU", None)])
def test_peak_bandwidth_is_looked_up_from_the_device_name(name, peak):
    assert peak_gbps_for(name) == peak


def test_gpu_section_checks_correctness_then_reports_bandwidth_and_tflops():
    sizes = GpuSizes(device=DEVICE, num_heads=4, num_kv_heads=2, head_dim=32, decode_batch=2,
                     decode_context=40, extend_batch=2, extend_new=20, extend_prefix=16,
                     check_max_len=70)
    rows = gpu_rows(None, quick=True, sizes=sizes, timer=_fixed_timer, device_name="NVIDIA H200")
    correctness = [r for r in rows if r["op"].startswith("correctness")]
    assert len(correctness) == 3 and all(r["ok"] for r in correctness)
    decode = next(r for r in rows if "decode b2" in r["op"])
    kv_bytes = 2 * 2 * 2 * 40 * 2 * 32                      # K+V, bf16, batch, context, Hkv, D
    assert decode["gbps"] == pytest.approx(kv_bytes / 2e-3 / 1e9)
    assert decode["peak_fraction"] == pytest.approx(decode["gbps"] / 4800)
    extend = next(r for r in rows if "extend after 16 prefix" in r["op"])
    flops = 4 * 2 * 4 * 32 * sum(16 + i + 1 for i in range(20))
    assert extend["tflops"] == pytest.approx(flops / 2e-3 / 1e12)
    table = markdown_table(rows)
    assert table.count("\n") == len(rows) + 1 and "TFLOP/s" in table and "GB/s" in table
