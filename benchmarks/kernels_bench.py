"""Kernel figures: ``python -m benchmarks.kernels_bench [--quick|--full] [--peak-gbps N]``.

CPU (always): the reference paged attention (the model's CPU path) against SDPA on the same K/V
laid out contiguously, SmolLM2-135M shapes (9 query heads, 3 kv heads, head_dim 64, fp32,
block 16), timed interleaved in one run; the ratio is the cost of paging on CPU.
GPU (when CUDA is available): the Triton decode kernel at batch 64, context 4k, 8 kv heads,
32 query heads, head_dim 128, bf16, as achieved HBM bandwidth and fraction of the device's peak;
the prefix-extend kernel in TFLOP/s; each next to torch SDPA on contiguous K/V. Correctness
against the reference is checked before timing. Writes ``kernels.json`` into ``--out``
(default ``benchmarks/out``) and prints a markdown table.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixgate.kernels import reference_paged_attention
from radixgate.kernels.testing import make_paged_case

from benchmarks.cli import size_parser, write_result

# HBM peak in GB/s by device-name fragment, most specific first.
PEAK_GBPS = [
    ("H200", 4800), ("H100 NVL", 3900), ("H100 PCIe", 2000), ("H100", 3350), ("GH200", 4000),
    ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100-PCIE-40GB", 1555), ("A100", 1555),
    ("L40S", 864), ("L4", 300), ("A10G", 600), ("A10", 600), ("RTX 4090", 1008),
]


def peak_gbps_for(name: str) -> float | None:
    for fragment, peak in PEAK_GBPS:
        if fragment.lower() in name.lower():
            return float(peak)
    return None


def _time_pair(first, second, reps: int) -> tuple[float, float]:
    """Best-of-``reps`` seconds of two callables, run alternately so machine load hits both alike."""
    first(), second()
    times_a, times_b = [], []
    for _ in range(reps):
        for fn, times in ((first, times_a), (second, times_b)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return min(times_a), min(times_b)


def _contiguous_batch(case):
    """Per-sequence K/V padded into [B, Hkv, L, D] plus a [B, 1, 1, L] mask, for plain SDPA."""
    longest = max(len(k) for k in case.keys)
    k = torch.zeros(len(case.keys), longest, *case.keys[0].shape[1:], dtype=case.q.dtype, device=case.q.device)
    v = torch.zeros_like(k)
    for b, (key, value) in enumerate(zip(case.keys, case.values)):
        k[b, :len(key)], v[b, :len(value)] = key, value
    lens = case.seq_lens.to(torch.int64)
    mask = torch.arange(longest, device=k.device)[None, :] < lens[:, None]
    return k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), mask[:, None, None, :]


def cpu_rows(quick: bool) -> list[dict]:
    shapes = dict(num_heads=9, num_kv_heads=3, head_dim=64, block_size=16, fill=0.0)
    scale = 64 ** -0.5
    reps = 3 if quick else 7
    scenarios = [("prefill 1k", [1024], [1024]), ("extend 1k after 1k prefix", [1024], [2048]),
                 ("decode b16 @ 1k", [1] * 16, [1024] * 16)]
    if not quick:
        scenarios.insert(1, ("prefill 2k", [2048], [2048]))
    rows = []
    for name, q_lens, seq_lens in scenarios:
        case = make_paged_case(q_lens, seq_lens, **shapes)
        paged = lambda: reference_paged_attention(case.q, case.k_cache, case.v_cache,  # noqa: E731
                                                  case.block_tables, case.cu_q_lens, case.seq_lens, scale)
        contiguous = _cpu_contiguous_fn(case, q_lens, seq_lens, scale)
        t_paged, t_contig = _time_pair(paged, contiguous, reps)
        rows.append(dict(section="cpu", op=f"reference paged attention, {name}", ms=t_paged * 1e3,
                         baseline="SDPA contiguous", baseline_ms=t_contig * 1e3, ratio=t_paged / t_contig))
    return rows


def _cpu_contiguous_fn(case, q_lens, seq_lens, scale):
    if len(q_lens) == 1:  # one sequence: SDPA with causal (offset) mask on its contiguous K/V
        q = case.q.transpose(0, 1)[None]                                             # [1, Hq, Lq, D]
        k, v = case.keys[0].transpose(0, 1)[None], case.values[0].transpose(0, 1)[None]
        if q_lens[0] == seq_lens[0]:
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        pos = torch.arange(seq_lens[0] - q_lens[0], seq_lens[0])[:, None]
        mask = torch.arange(seq_lens[0])[None, :] <= pos
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    k, v, mask = _contiguous_batch(case)
    q = case.q[:, :, None, :]                                                        # [B, Hq, 1, D]
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


@dataclass(frozen=True)
class GpuSizes:
    """Shapes of the GPU section (the issue's by default; tests shrink them to run on CPU)."""
    device: str = "cuda"
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    decode_batch: int = 64
    decode_context: int = 4096
    extend_batch: int = 4
    extend_new: int = 2048
    extend_prefix: int = 2048
    check_max_len: int = 2049  # longest sequence in the correctness checks


def _cuda_ms(fn) -> float:
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=25, rep=100))


def _gpu_case(sizes: GpuSizes, q_lens, seq_lens):
    return make_paged_case(q_lens, seq_lens, num_heads=sizes.num_heads, num_kv_heads=sizes.num_kv_heads,
                           head_dim=sizes.head_dim, block_size=16, dtype=torch.bfloat16,
                           device=sizes.device, fill=0.0)


def _run_triton(case, scale, **tiles):
    from radixgate.kernels.triton_attention import triton_paged_attention
    return triton_paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                  case.cu_q_lens, case.seq_lens, scale, **tiles)


def gpu_correctness(sizes: GpuSizes) -> dict:
    """Max abs error of the Triton kernels (bf16) against the fp32 reference on mixed batches."""
    cases = {"decode": ([1] * 5, [1, 16, 17, 300, 1000], {}),
             "decode split 8": ([1] * 3, [5, 700, 2049], {"num_splits": 8}),
             "extend+decode": ([1, 300, 1, 64], [77, 1000, 5, 64], {})}
    checks = {}
    for name, (q_lens, seq_lens, tiles) in cases.items():
        seq_lens = [min(n, sizes.check_max_len) for n in seq_lens]
        checks[name] = (_gpu_case(sizes, [min(q, n) for q, n in zip(q_lens, seq_lens)], seq_lens), tiles)
    errors = {}
    for name, (case, tiles) in checks.items():
        expected = reference_paged_attention(case.q.float(), case.k_cache.float(), case.v_cache.float(),
                                             case.block_tables, case.cu_q_lens, case.seq_lens, 0.1)
        errors[name] = float((_run_triton(case, 0.1, **tiles).float() - expected).abs().max())
    return errors


def gpu_rows(peak_override: float | None, quick: bool, sizes: GpuSizes = GpuSizes(), timer=_cuda_ms,
             device_name: str | None = None) -> list[dict]:
    name = device_name or torch.cuda.get_device_name()
    peak = peak_override or peak_gbps_for(name)
    errors = gpu_correctness(sizes)
    print(f"GPU {name}: max abs error vs reference {errors}")
    rows = [dict(section="gpu", op=f"correctness {k} (bf16 max abs err)", ms=0.0, figure=f"{v:.2e}",
                 error=v, ok=v < 3e-2) for k, v in errors.items()]
    return rows + _decode_rows(sizes, peak, quick, timer) + _extend_rows(sizes, quick, timer)


def _decode_rows(sizes: GpuSizes, peak: float | None, quick: bool, timer) -> list[dict]:
    batch, context, scale = sizes.decode_batch, sizes.decode_context, sizes.head_dim ** -0.5
    case = _gpu_case(sizes, [1] * batch, [context] * batch)
    kv_bytes = 2 * case.k_cache.element_size() * batch * context * sizes.num_kv_heads * sizes.head_dim
    k, v, _ = _contiguous_batch(case)                                          # [B, Hkv, L, D], all full
    q4 = case.q[:, :, None, :]                                                 # [B, Hq, 1, D]
    t_sdpa = timer(lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True))
    shape = f"b{batch} ctx{context} kv{sizes.num_kv_heads} q{sizes.num_heads} d{sizes.head_dim} bf16"
    rows = []
    for block_n in ([None] if quick else [None, 32, 128]):
        t_kernel = timer(lambda: _run_triton(case, scale, block_n=block_n))
        gbps = kv_bytes / (t_kernel * 1e-3) / 1e9
        figure = f"{gbps:.0f} GB/s" + (f" = {gbps / peak:.0%} of {peak:.0f} GB/s peak" if peak else "")
        rows.append(dict(section="gpu", op=f"triton decode {shape} BLOCK_N={block_n or 'default'}",
                         ms=t_kernel, baseline="SDPA contiguous", baseline_ms=t_sdpa,
                         ratio=t_kernel / t_sdpa, figure=figure, gbps=gbps,
                         peak_fraction=gbps / peak if peak else None))
    return rows


def _extend_rows(sizes: GpuSizes, quick: bool, timer) -> list[dict]:
    from torch.nn.attention.bias import causal_lower_right
    rows, scale, batch, new = [], sizes.head_dim ** -0.5, sizes.extend_batch, sizes.extend_new
    group = sizes.num_heads // sizes.num_kv_heads
    for label, prefix in [("prefill", 0), (f"extend after {sizes.extend_prefix} prefix", sizes.extend_prefix)]:
        case = _gpu_case(sizes, [new] * batch, [prefix + new] * batch)
        flops = 4 * batch * sizes.num_heads * sizes.head_dim * sum(prefix + i + 1 for i in range(new))
        q = case.q.view(batch, new, sizes.num_heads, sizes.head_dim).transpose(1, 2)      # [B, Hq, Lq, D]
        k = torch.stack(case.keys).repeat_interleave(group, dim=2).transpose(1, 2)     # [B, Hq, L, D]
        v = torch.stack(case.values).repeat_interleave(group, dim=2).transpose(1, 2)
        bias = causal_lower_right(new, prefix + new)
        t_sdpa = timer(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale))
        for block_m, block_n in ([(None, None)] if quick else [(None, None), (64, 32), (128, 64)]):
            t_kernel = timer(lambda: _run_triton(case, scale, block_m=block_m, block_n=block_n))
            tflops = flops / (t_kernel * 1e-3) / 1e12
            rows.append(dict(section="gpu", op=f"triton {label} {batch}x{new} q{sizes.num_heads} "
                                               f"kv{sizes.num_kv_heads} d{sizes.head_dim} bf16 "
                                               f"BM={block_m or 'default'} BN={block_n or 'default'}",
                             ms=t_kernel, baseline="SDPA contiguous (lower-right causal)",
                             baseline_ms=t_sdpa, ratio=t_kernel / t_sdpa,
                             figure=f"{tflops:.1f} TFLOP/s", tflops=tflops))
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = size_parser(__doc__, quick="fewer sizes and repetitions", full="all sizes")
    parser.add_argument("--peak-gbps", type=float, default=None, help="override the device's HBM peak")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    results = {"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": cpu_rows(args.quick)}
    if torch.cuda.is_available():
        results["device"] = torch.cuda.get_device_name()
        results["rows"] += gpu_rows(args.peak_gbps, args.quick)
    else:
        results["gpu_skipped"] = "no CUDA device: GPU section (Triton decode bandwidth, extend TFLOP/s) skipped"
        print(results["gpu_skipped"])
    write_result(args.out, "kernels.json", results)
    print(markdown_table(results["rows"]))
    return results


def markdown_table(rows: list[dict]) -> str:
    lines = ["| section | op | ms | baseline | baseline ms | ratio | figure |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['section']} | {row['op']} | {row['ms']:.3f} | {row.get('baseline', '')} | "
                     f"{row.get('baseline_ms', float('nan')):.3f} | {row.get('ratio', float('nan')):.2f} | "
                     f"{row.get('figure', '')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
