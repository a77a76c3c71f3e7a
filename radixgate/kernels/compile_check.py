"""Compile the Triton kernels for NVIDIA GPUs on a machine without one.

``python -m radixgate.kernels.compile_check [--arch 90 80]`` builds the exact launch plans the
launchers make (on ``meta`` tensors of the benchmark's shapes), compiles each kernel to a cubin
for every architecture with Triton's bundled ptxas, and prints registers and spill bytes. Catches
kernels that would fail to compile on a GPU and register spills, before a device is lent.
Run it without TRITON_INTERPRET (the interpreter replaces the kernels with Python functions).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from radixgate.kernels import triton_attention, triton_kv

_TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                 torch.int32: "i32", torch.int64: "i64"}


def _signature(kernel, args: dict, meta: dict) -> tuple[dict, dict, dict]:
    """Mimic Triton's specialisation: ints equal to 1 become constants, multiples of 16 and
    tensors get the divisibility-16 hint (torch allocations are 16-byte aligned)."""
    signature, constexprs, attrs = {}, dict(meta), {}
    for index, name in enumerate(kernel.arg_names):
        if name in meta:
            signature[name] = "constexpr"
            continue
        value = args[name]
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + _TRITON_TYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif value == 1:
            signature[name], constexprs[name] = "constexpr", 1
        else:
            signature[name] = "i32" if abs(value) < 2 ** 31 else "i64"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def _ptxas_report(ptx: str, arch: int) -> dict:
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptxas = next(p for p in (os.path.join(bin_dir, n) for n in ("ptxas-blackwell", "ptxas")) if os.path.exists(p))
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as handle:
        handle.write(ptx)
    suffix = "a" if arch == 90 else ""
    result = subprocess.run([ptxas, "-v", f"-arch=sm_{arch}{suffix}", handle.name, "-o", os.devnull],
                            capture_output=True, text=True)
    os.unlink(handle.name)
    if result.returncode != 0:
        raise RuntimeError(f"ptxas failed: {result.stderr}")
    registers = re.search(r"Used (\d+) registers", result.stderr)
    spills = re.search(r"(\d+) bytes spill stores", result.stderr)
    return {"registers": int(registers.group(1)) if registers else 0,
            "spill_bytes": int(spills.group(1)) if spills else 0}


def compile_launch(kernel, args: dict, meta: dict, arch: int) -> dict:
    """Compile one launch plan for sm_<arch>; returns registers, spill bytes and shared memory."""
    meta = dict(meta)
    options = {k: meta.pop(k) for k in ("num_warps", "num_stages") if k in meta}
    signature, constexprs, attrs = _signature(kernel, args, meta)
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    return {**_ptxas_report(compiled.asm["ptx"], arch), "shared_bytes": compiled.metadata.shared}


def launch_plans(dtype: torch.dtype = torch.bfloat16) -> dict[str, tuple]:
    """The benchmark's shapes (kv 8, q 32, d 128, block 16) plus SmolLM2's (kv 3, q 9, d 64)."""
    plans = {}
    for label, num_heads, num_kv_heads, head_dim in (("d128", 32, 8, 128), ("smollm2", 9, 3, 64)):
        meta = dict(device="meta", dtype=dtype)
        cache = torch.empty(4096, 16, num_kv_heads, head_dim, **meta)
        tables = torch.empty(64, 256, dtype=torch.int32, device="meta")
        seq_lens = torch.empty(64, dtype=torch.int32, device="meta")
        q = torch.empty(64, num_heads, head_dim, **meta)
        for splits in (1, 4):
            plan = triton_attention.decode_launches(q, cache, cache, tables, seq_lens, 0.1, q.clone(), splits)
            for kernel, _, args, kmeta in plan:
                plans[f"{label} {kernel.__name__} splits={splits}"] = (kernel, args, kmeta)
        q_long = torch.empty(4096, num_heads, head_dim, **meta)
        cu = torch.empty(65, dtype=torch.int32, device="meta")
        kernel, _, args, kmeta = triton_attention.prefill_launch(q_long, cache, cache, tables, cu, seq_lens,
                                                                 0.1, q_long.clone())
        plans[f"{label} {kernel.__name__}"] = (kernel, args, kmeta)
        plans[f"{label} store_kv"] = _store_plan(q_long[:, :num_kv_heads], cache)
        plans[f"{label} copy_blocks"] = _copy_plan(cache)
    return plans


def _store_plan(k, cache):
    args = dict(k_ptr=k, v_ptr=k, k_cache_ptr=cache, v_cache_ptr=cache,
                slot_ptr=torch.empty(k.shape[0], dtype=torch.int64, device="meta"),
                stride_kt=k.stride(0), stride_kh=k.stride(1), stride_vt=k.stride(0), stride_vh=k.stride(1),
                stride_cb=cache.stride(0), stride_cs=cache.stride(1), stride_ch=cache.stride(2),
                block_size=cache.shape[1], num_kv_heads=cache.shape[2], head_dim=cache.shape[3])
    return triton_kv.store_kv_kernel, args, triton_kv.head_pads(cache)


def _copy_plan(cache):
    args = dict(k_cache_ptr=cache, v_cache_ptr=cache, pairs_ptr=torch.empty(8, 2, dtype=torch.int64, device="meta"),
                num_slots_ptr=torch.empty(8, dtype=torch.int32, device="meta"),
                stride_cb=cache.stride(0), stride_cs=cache.stride(1), stride_ch=cache.stride(2),
                num_kv_heads=cache.shape[2], head_dim=cache.shape[3])
    return triton_kv.copy_blocks_kernel, args, triton_kv.head_pads(cache)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90, 80])
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter cannot compile kernels", file=sys.stderr)
        return 2
    worst = 0
    for arch in args.arch:
        for name, (kernel, kargs, meta) in launch_plans().items():
            report = compile_launch(kernel, kargs, meta, arch)
            worst = max(worst, report["spill_bytes"])
            print(f"sm_{arch} {name}: {report}", flush=True)
    print(f"max spill bytes: {worst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
