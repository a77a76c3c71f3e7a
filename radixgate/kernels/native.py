"""radixgate's own CPU kernels (``native.c``) for the decode step's small ops, built with the
machine's C compiler on first use and called through ctypes.

A decode step of a small model is mostly per-op overhead, not arithmetic: torch's fp32
``rms_norm`` of one row dispatches ~8 ops (~11 us), the residual add before it another,
rope and the K/V store ~26 us a layer, the lone decode row's attention (gather, SDPA) ~25 us.
One C call does each: ``add_rms_norm``, ``rope_store``, ``decode_attention``, ``extend_attention``
(``native_extend.c``: a cache hit's few new tokens over its prefix), ``silu_mul``,
``int4_mm`` (``native_int4.c``: torch's int4 matmul, its very bits, fast at many rows),
``int4_mm_amx`` (``native_int4_amx.c``: the int4 matmul on AMX tiles, from a few rows on),
``int4_mm_fixed`` (``native_int4_fixed.c``: the int4 matmul with exact integer group sums, the
same bits at every row count, fast at every row count),
``topk_indices`` (the rescored head's candidates) and ``argmax_rows`` (greedy picks).

- **Build**: ``cc -O3 -march=native -fno-math-errno -fopenmp -shared -fPIC`` (about 0.5 s), once per source, compiler
  and CPU, into ``$RADIXGATE_CACHE_DIR/native`` (default ``~/.cache/radixgate/native``),
  written to a temporary name and renamed, so processes starting together never load half a
  file. No compiler, a failed build or ``RADIXGATE_NATIVE=0``: ``library()`` is None, one
  log line says why, and every caller runs its torch ops instead.
- **Threads**: ``decode_attention`` and ``extend_attention`` share their work among torch's
  own OpenMP workers (built with ``-fopenmp``, the library resolves libgomp to the copy
  torch loaded: one pool; ``shares_torchs_openmp`` checks, and where the library bound
  another runtime they run on the calling thread). Call them from the thread that runs the model's
  torch ops: a long-lived other thread would get a pool of its own.
- **Contract**: the wrappers take CPU float32 tensors that are contiguous (the callers check
  ``usable``); reductions run in a fixed order per row, so a row's result never depends on
  the other rows of the call nor on the thread count. ``decode_attention`` and
  ``extend_attention`` check every block id they read against the cache's size and raise
  instead of reading outside it.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from radixgate.kernels.checks import check_cache_pair

log = logging.getLogger(__name__)
SOURCES = tuple(Path(__file__).with_name(n) for n in ("native.c", "native_extend.c", "native_int4.c",
                                                   "native_int4_amx.c", "native_int4_fixed.c"))
HEADERS = tuple(Path(__file__).with_name(n) for n in ("native_math.h", "native_int4.h"))     # part of the build's key
ENABLE_ENV = "RADIXGATE_NATIVE"
CACHE_ENV = "RADIXGATE_CACHE_DIR"
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC")
DELTA_KINDS = {None: 0, torch.bfloat16: 1, torch.float32: 2}
_P, _L, _I, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "radixgate")
    return Path(root) / "native"


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernels, or None (disabled, no compiler, build failed: logged once)."""
    if os.environ.get(ENABLE_ENV, "1") == "0":
        log.info("native CPU kernels off (%s=0): torch ops", ENABLE_ENV)
        return None
    try:
        lib = ctypes.CDLL(str(_built()))
    except (OSError, subprocess.CalledProcessError, RuntimeError) as e:
        log.warning("native CPU kernels unavailable (%s): torch ops instead", _reason(e))
        return None
    lib.rg_parallel_width.restype = _I
    lib.rg_parallel_width.argtypes = [_I]
    lib.rg_add_rms_norm.restype = None
    lib.rg_add_rms_norm.argtypes = [_P, _P, _I, _P, _P, _I, _L, _L, _F]
    lib.rg_silu_mul_bf16.restype = None
    lib.rg_silu_mul_bf16.argtypes = [_P, _L, _L, _P]
    lib.rg_set_exp16.restype = None
    lib.rg_set_exp16.argtypes = [_P]
    lib.rg_exp16_in_use.restype = _I
    lib.rg_exp16_in_use.argtypes = []
    lib.rg_set_exp16(_torch_exp16())
    lib.rg_rope_store.restype = _I
    lib.rg_rope_store.argtypes = [_P, _I, _L, _L, _L, _L, _P, _P, _P, _P, _P, _P, _P, _L, _P]
    lib.rg_argmax_rows.restype = None
    lib.rg_argmax_rows.argtypes = [_P, _L, _L, _P]
    lib.rg_topk_indices.restype = _I
    lib.rg_topk_indices.argtypes = [_P, _L, _L, _L, _P]
    lib.rg_decode_attention.restype = _I
    lib.rg_decode_attention.argtypes = [_P, _P, _P, _P, _L, _P, _L, _L, _L, _L, _L, _L, _F, _I, _P]
    lib.rg_extend_attention.restype = _I
    lib.rg_extend_attention.argtypes = [_P, _P, _P, _P, _L, _L, _L, _L, _L, _L, _L, _L, _F,
                                        _I, _P]
    lib.rg_ragged_attention_kv.restype = _I
    lib.rg_ragged_attention_kv.argtypes = [_P, _I, _P, _P, _P, _P, _P, _L, _P, _P, _L, _L, _L,
                                           _L, _L, _L, _F, _L, _I, _P]
    lib.rg_int4_mm.restype = _I
    lib.rg_int4_mm.argtypes = [_P, _P, _P, _P, _L, _L, _L, _L, _I]
    lib.rg_int4_mm_amx.restype = _I
    lib.rg_int4_mm_amx.argtypes = [_P, _P, _P, _P, _L, _L, _L, _L, _I]
    lib.rg_amx_init.restype = _I
    lib.rg_amx_init.argtypes = []
    lib.rg_int4_mm_fixed.restype = _I
    lib.rg_int4_mm_fixed.argtypes = [_P, _I, _P, _P, _P, _L, _L, _L, _I, _I]
    lib.rg_int4_fixed_from_q4.restype = _I
    lib.rg_int4_fixed_from_q4.argtypes = [_P, _I, _L, _L, _P, _P]
    lib.rg_int4_fixed_has_amx.restype = _I
    lib.rg_int4_fixed_has_amx.argtypes = []
    return lib


def _gomp_entry(lib: ctypes.CDLL) -> int | None:
    """Where ``lib``'s OpenMP calls go: the address its ``GOMP_parallel`` resolves to (dlsym
    searches the library's own dependencies), or None where it makes no such call."""
    try:
        return ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value
    except AttributeError:
        return None


@functools.cache
def shares_torchs_openmp() -> bool:
    """The built library's OpenMP calls go to the runtime torch's own ops use: one pool.
    Another runtime merely mapped beside changes nothing (the sentencepiece wheel bundles a
    renamed libgomp, and the gguf package imports sentencepiece wherever it is installed).
    Where the library bound a different runtime than torch (a torch on Intel's libiomp), the
    kernels run on the calling thread: a second pool would slow every torch op after it."""
    lib = library()
    ours = None if lib is None else _gomp_entry(lib)
    if ours is None:                         # no kernels, or built without OpenMP: no pool
        return True
    try:
        torch_cpu = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    except OSError:                          # not torch's usual layout: nothing to compare
        log.warning("native kernels: torch's CPU library not found: one thread")
        return False
    if ours != _gomp_entry(torch_cpu):
        log.warning("native kernels: their OpenMP runtime is not torch's: one thread")
        return False
    return True


def default_threads() -> int:
    """The workers the kernels use when not told: torch's thread count, or 1 where the
    library's OpenMP runtime is not torch's (``shares_torchs_openmp``)."""
    return torch.get_num_threads() if shares_torchs_openmp() else 1


def _torch_exp16() -> int | None:
    """The address of torch's own 16-lane e^x (SLEEF's ``Sleef_expf16_u10``, exported by
    libtorch_cpu and used by its AVX-512 float kernels, silu's included), so that
    ``silu_mul`` rounds as torch does; None where torch's CPU kernels are not AVX-512 or the
    symbol is missing (the kernel then runs its scalar loop)."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AVX512_BF16", "AMX"):
        return None
    try:
        core = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        return ctypes.cast(core.Sleef_expf16_u10, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def _reason(e: Exception) -> str:
    if isinstance(e, subprocess.CalledProcessError):
        return (e.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or str(e)
    return str(e)


def _built() -> Path:
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise RuntimeError("no C compiler (cc) on PATH")
    sources = [path.read_bytes() for path in (*SOURCES, *HEADERS)]
    key = hashlib.sha256(b"\0".join([*sources, compiler.encode(), " ".join(FLAGS).encode(),
                                     platform.machine().encode(), _cpu_flags()])).hexdigest()[:16]
    target = cache_dir() / f"kernels-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run([compiler, *FLAGS, "-o", str(built), *map(str, SOURCES), "-lm"], check=True,
                       capture_output=True, timeout=120)
        os.replace(built, target)
    for old in target.parent.glob("kernels-*.so"):       # earlier sources' builds
        if old != target:
            old.unlink(missing_ok=True)      # a process still running one keeps its mapping
    log.info("built native CPU kernels: %s", target)
    return target


def _cpu_flags() -> bytes:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.encode()
    except OSError:
        pass
    return platform.processor().encode()


def usable(*tensors: torch.Tensor) -> bool:
    """The kernels are built and every tensor is a contiguous CPU float32 one (called per
    layer: kept to attribute reads, ~0.3 us a tensor)."""
    if library() is None:
        return False
    for t in tensors:
        if t.dtype is not torch.float32 or not t.is_cpu or not t.is_contiguous():
            return False
    return True


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor | None,
                 eps: float, out_dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """x [T, H] float32, in place: ``x += delta`` (bf16 or float32, same shape, or None);
    then, with ``weight``, returns HF's RMSNorm of the new x in ``out_dtype`` (float32, or
    bfloat16 rounded as torch's ``.to`` rounds: what a bf16 matmul takes)."""
    rows, n = x.shape
    if weight is not None and weight.shape != (n,):
        raise ValueError(f"weight must be [{n}], got {tuple(weight.shape)}")
    if delta is not None:
        if delta.shape != x.shape or not delta.is_contiguous() or delta.dtype not in DELTA_KINDS:
            raise ValueError(f"delta must be a contiguous bf16/float32 {tuple(x.shape)} tensor")
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    out = None if weight is None else torch.empty(x.shape, dtype=out_dtype)
    library().rg_add_rms_norm(
        x.data_ptr(), 0 if delta is None else delta.data_ptr(),
        DELTA_KINDS[None if delta is None else delta.dtype],
        0 if weight is None else weight.data_ptr(), 0 if out is None else out.data_ptr(),
        int(out_dtype == torch.bfloat16), rows, n, eps)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """bf16 [T, 2I] (gate, then up) -> bf16 [T, I]: ``F.silu(gate) * up`` with torch's
    bf16 roundings (after the silu and after the product)."""
    tokens, width = gate_up.shape
    if gate_up.dtype != torch.bfloat16 or not gate_up.is_contiguous() or width % 2:
        raise ValueError("gate_up must be a contiguous bf16 [T, 2I] tensor")
    out = torch.empty((tokens, width // 2), dtype=torch.bfloat16)
    library().rg_silu_mul_bf16(gate_up.data_ptr(), tokens, width // 2, out.data_ptr())
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     tables: torch.Tensor, lens: torch.Tensor, scale: float,
                     threads: int | None = None) -> torch.Tensor:
    """One query per row: q [n, Hq, D] over float32 caches [blocks, bs, Hkv, D], row i
    reading positions ``0 .. lens[i]-1`` through ``tables[i]`` (int32 block ids) -> [n, Hq, D].
    ``threads`` (default ``default_threads()``) workers of torch's OpenMP pool share the
    (row, kv head) items; the result is the same for any count."""
    rows, heads, dim = q.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    if tables.dtype != torch.int32 or lens.dtype != torch.int32 or not tables.is_contiguous() \
            or tables.shape[0] != rows or lens.shape != (rows,) or not lens.is_contiguous():
        raise ValueError("tables [n, width] and lens [n] must be contiguous int32")
    out = torch.empty_like(q)
    status = library().rg_decode_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), tables.shape[1],
        lens.data_ptr(), rows, heads, kv_heads, dim, block_size, num_blocks, scale,
        default_threads() if threads is None else threads, out.data_ptr())
    _check_status(status, "a block table names a block outside the cache (or a length "
                          "exceeds its table)",
                  f"{heads} query heads do not group over {kv_heads} kv heads (at most 64 a "
                  f"group)")
    return out


def _check_status(status: int, outside: str, shape: str) -> None:
    """The attention kernels' return codes: 0 fine; -1 ``outside`` (a block id or a table);
    -2 out of memory; -3 ``shape`` (one the kernel does not take)."""
    if status != 0:
        raise ValueError({-1: outside, -2: "out of memory", -3: shape}.get(status, str(status)))


EXTEND_MAX_QUERIES = 64      # native_extend.c's q_len limit


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     table: torch.Tensor, total: int, scale: float,
                     threads: int | None = None) -> torch.Tensor:
    """One sequence's q_len (<= 64) new queries q [q_len, Hq, D] float32 (query i at
    position ``total - q_len + i``), causal over float32 caches [blocks, bs, Hkv, D] through
    ``table`` (contiguous int32 block ids) -> [q_len, Hq, D] float32 (``native_extend.c``).
    ``threads`` (default ``default_threads()``) workers of torch's OpenMP pool; each query
    vector's sums run in one fixed order, the same for any thread count."""
    q_len, heads, dim = q.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    if table.dtype != torch.int32 or table.dim() != 1 or not table.is_contiguous():
        raise ValueError("table must be a contiguous int32 [blocks] tensor")
    q = q.contiguous()
    out = torch.empty_like(q)
    status = library().rg_extend_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), table.data_ptr(), table.numel(),
        q_len, total, heads, kv_heads, dim, block_size, num_blocks, scale,
        default_threads() if threads is None else threads, out.data_ptr())
    _check_status(status, "the block table names a block outside the cache (or is too short "
                          "for the sequence)",
                  f"shape not taken: {heads} heads over {kv_heads}, head dim {dim} (a multiple "
                  f"of 16 up to 256), {q_len} queries (1..64) of {total}")
    return out


RAGGED_TILE_ROWS = 16        # query rows an item (a verify step of 9 rows: one tile, 0.34 -> 0.23 ms a layer at 2k)


# the cache dtypes ``ragged_attention`` reads in place (native_extend.c's kinds)
RAGGED_KV_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3,
                   torch.float8_e4m3fn: 4}


def ragged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     tables: torch.Tensor, cu_q: torch.Tensor, totals: torch.Tensor,
                     scale: float, threads: int | None = None,
                     tile_rows: int = RAGGED_TILE_ROWS, k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of every sequence of a step, any query count each (the
    deterministic mode's only attention): sequence s owns rows ``cu_q[s]:cu_q[s+1]`` of q
    [T, Hq, D] float32, its queries at the last positions of its ``totals[s]``, its keys in
    caches [blocks, bs, Hkv, D] through ``tables[s]`` (int32 [n, width]) -> [T, Hq, D].
    The caches are any of ``RAGGED_KV_KINDS`` (int8 and fp8 with float16 ``k_scale`` /
    ``v_scale`` [blocks, bs, Hkv]), read in place: each value converts to float32 exactly, so
    the bits are those of a float32 cache holding the dequantized values.
    Every query vector runs ``extend_attention``'s arithmetic whole on one worker, so its bits
    depend only on its own query and keys: not on the rows beside it, its sequence's query
    count, ``tile_rows`` or ``threads`` (default ``default_threads()``)."""
    return RaggedCall(tables, cu_q, totals, tile_rows)(q, k_cache, v_cache, scale, k_scale,
                                                       v_scale, threads)


class RaggedCall:
    """``ragged_attention`` with one step's tables, query offsets and totals checked and
    bound once (every layer of a forward reads the same; the checks and argument marshalling
    cost a third of a decode row's call at 512 positions). Per call it checks the query and
    the caches' kind, as ``ragged_attention`` does."""

    def __init__(self, tables: torch.Tensor, cu_q: torch.Tensor, totals: torch.Tensor,
                 tile_rows: int = RAGGED_TILE_ROWS):
        seqs = totals.shape[0]
        for name, t, shape in (("tables", tables, None), ("cu_q", cu_q, (seqs + 1,)),
                               ("totals", totals, (seqs,))):
            if t.dtype != torch.int32 or not t.is_contiguous() or (shape and t.shape != shape):
                raise ValueError(f"{name} must be a contiguous int32 tensor"
                                 + (f" of shape {shape}" if shape else ""))
        if tables.dim() != 2 or tables.shape[0] != seqs:
            raise ValueError(f"tables must be [{seqs}, width]")
        self.rows = int(cu_q[-1]) if seqs else 0
        if seqs and int(cu_q[0]) != 0:
            raise ValueError(f"cu_q must run from 0 to {self.rows}")
        self._keep = (tables, cu_q, totals)               # the pointers below stay valid
        self._index = (tables.data_ptr(), tables.shape[1], cu_q.data_ptr(), totals.data_ptr(),
                       seqs)
        self.tile_rows = tile_rows
        self._call = library().rg_ragged_attention_kv

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 scale: float, k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None, threads: int | None = None) -> torch.Tensor:
        kind = _ragged_kind(k_cache, v_cache, k_scale, v_scale)
        rows, heads, dim = q.shape
        if rows != self.rows:
            raise ValueError(f"cu_q must run from 0 to q's {rows} rows (it ends at {self.rows})")
        if q.dtype is not torch.float32:
            raise ValueError(f"q must be float32, not {q.dtype}")
        q = q.contiguous()
        num_blocks, block_size, kv_heads, cache_dim = k_cache.shape
        if cache_dim != dim:
            raise ValueError(f"q's head dim {dim} is not the caches' {cache_dim}")
        out = torch.empty_like(q)
        status = self._call(
            q.data_ptr(), kind, k_cache.data_ptr(), v_cache.data_ptr(),
            None if k_scale is None else k_scale.data_ptr(),
            None if v_scale is None else v_scale.data_ptr(), *self._index, heads, kv_heads, dim,
            block_size, num_blocks, scale, self.tile_rows,
            default_threads() if threads is None else threads, out.data_ptr())
        if status:
            _check_status(status, "a block table names a block outside the cache (or is too "
                                  "short for its sequence)",
                          f"shape not taken: {heads} heads over {kv_heads}, head dim {dim} (a "
                          f"multiple of 16 up to 256), every sequence 1 <= queries <= its "
                          f"length")
        return out


def _ragged_kind(k_cache, v_cache, k_scale, v_scale) -> int:
    """The kernel's kind code for these caches, after checking what it reads blindly: one
    of ``RAGGED_KV_KINDS`` for both, the pair and its scales as ``checks.check_cache_pair``
    wants them, every tensor a contiguous CPU one (``_check_in_place``)."""
    kind = RAGGED_KV_KINDS.get(k_cache.dtype)
    if kind is None or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"caches of {k_cache.dtype} / {v_cache.dtype} not taken: one of "
                         f"{sorted(map(str, RAGGED_KV_KINDS))} for both")
    _check_in_place(k_cache, v_cache, k_scale, v_scale)
    return kind


def _check_in_place(k_cache, v_cache, k_scale, v_scale) -> None:
    """A cache pair a kernel reads or writes through raw pointers: ``check_cache_pair``'s
    shapes, dtypes and scales, and every tensor whole-contiguous on the CPU."""
    check_cache_pair(k_cache, v_cache, k_scale, v_scale)
    for t in (k_cache, v_cache, k_scale, v_scale):
        if t is not None and (not t.is_contiguous() or not t.is_cpu):
            raise ValueError("caches and scales must be contiguous CPU tensors")


def attention_takes_head_dim(dim: int) -> bool:
    """The head dims ``ragged_attention`` and ``extend_attention`` take: multiples of 16 up
    to 256."""
    return dim % 16 == 0 and dim <= 256


TOPK_MAX = 64


def topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """int64 [rows, k]: the indices of each row's ``k`` largest values of x [rows, n]
    (contiguous float32, ``k <= TOPK_MAX``), in no order; of equal values the first."""
    rows, n = x.shape
    out = torch.empty((rows, k), dtype=torch.int64)
    if library().rg_topk_indices(x.data_ptr(), rows, n, k, out.data_ptr()) != 0:
        raise ValueError(f"top-k needs 0 < k <= min({TOPK_MAX}, {n}), got {k}")
    return out


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int,
               k_scale: torch.Tensor | None = None,
               v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's rope and K/V store in one pass: qkv [T, (Hq + 2 Hkv) D] float32 or bf16
    (read exactly as float32); cos,
    sin [T, 1, D] (``rope.rope_cos_sin``); k rotated and v go to cache slots ``slots``
    (int64 [T], -1 skipped) of float32 caches [blocks, bs, Hkv, D], or of int8 caches with
    their float16 ``k_scale`` / ``v_scale`` [blocks, bs, Hkv]; returns q rotated [T, Hq, D].
    The same arithmetic as ``apply_rope`` then ``store_kv`` (int8: ``quantize_kv``'s)."""
    num_blocks, block_size, kv_heads, dim = k_cache.shape
    tokens = qkv.shape[0]
    if slots.dtype != torch.int64 or not slots.is_contiguous() or slots.shape != (tokens,):
        raise ValueError("slots must be a contiguous int64 [T] tensor")
    if cos.shape != (tokens, 1, dim) or sin.shape != cos.shape:
        raise ValueError(f"cos and sin must be [{tokens}, 1, {dim}]")
    if qkv.shape != (tokens, (heads + 2 * kv_heads) * dim):
        raise ValueError(f"qkv must be [{tokens}, {(heads + 2 * kv_heads) * dim}]")
    _check_store_caches(k_cache, v_cache, k_scale, v_scale)
    q = torch.empty((tokens, heads, dim), dtype=torch.float32)
    if qkv.dtype not in (torch.float32, torch.bfloat16) or not qkv.is_contiguous():
        raise ValueError("qkv must be a contiguous float32 or bf16 tensor")
    scales = (None, None) if k_scale is None else (k_scale.data_ptr(), v_scale.data_ptr())
    if library().rg_rope_store(qkv.data_ptr(), int(qkv.dtype == torch.bfloat16), tokens,
                               heads, kv_heads, dim, cos.data_ptr(),
                               sin.data_ptr(), slots.data_ptr(), k_cache.data_ptr(),
                               v_cache.data_ptr(), *scales, num_blocks * block_size,
                               q.data_ptr()) != 0:
        raise ValueError(f"a slot is beyond the cache ({num_blocks} x {block_size} slots)")
    return q


ROPE_STORE_DTYPES = (torch.float32, torch.int8)     # the caches ``rope_store`` writes


def _check_store_caches(k_cache, v_cache, k_scale, v_scale) -> None:
    """What ``rope_store`` writes blindly: caches of one of ``ROPE_STORE_DTYPES``, checked as
    every in-place cache is (``_check_in_place``)."""
    if k_cache.dtype not in ROPE_STORE_DTYPES or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"rope_store writes float32 or int8 caches, not {k_cache.dtype}")
    _check_in_place(k_cache, v_cache, k_scale, v_scale)


def argmax_rows(x: torch.Tensor) -> list[int]:
    """Each row's greedy pick of x [rows, n] (contiguous float32): the first index of its
    largest value, NaN read as -inf (none finite: 0), what ``max`` over
    ``nan_to_num(x, nan=-inf)`` picks."""
    rows, n = x.shape
    out = torch.empty(rows, dtype=torch.int64)
    library().rg_argmax_rows(x.data_ptr(), rows, n, out.data_ptr())
    return out.tolist()


def _int4_args(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor,
               group: int) -> tuple[int, int, int]:
    rows, k = x.shape
    n = scales_and_zeros.shape[1]
    if x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError("x must be a contiguous bf16 [M, K] tensor")
    if packed.numel() * 2 != n * k or scales_and_zeros.shape != (k // group, n, 2):
        raise ValueError(f"weights do not match x's {k} columns (groups of {group})")
    return rows, n, k


def _int4_call(fn, x, packed, scales_and_zeros, group, threads) -> torch.Tensor | None:
    rows, n, k = _int4_args(x, packed, scales_and_zeros, group)
    out = torch.empty((rows, n), dtype=torch.bfloat16)
    status = fn(x.data_ptr(), packed.data_ptr(), scales_and_zeros.data_ptr(), out.data_ptr(),
                rows, n, k, group, default_threads() if threads is None else threads)
    if status == -4:
        return None
    _check_status(status, "", f"shape not taken: N {n} (a multiple of 64), K {k} "
                              f"(a multiple of 32 and of the group {group})")
    return out


def int4_mm(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor,
            group: int, threads: int | None = None) -> torch.Tensor | None:
    """x [M, K] contiguous bf16 times int4 weights in torch's CPU pack (``packed`` uint8
    [N/64, K, 32], ``scales_and_zeros`` bf16 [K/group, N, 2]) -> bf16 [M, N], the same bits
    as ``torch.ops.aten._weight_int4pack_mm_for_cpu`` (``native_int4.c``), faster from a few
    dozen rows on. None where the library was built without AVX-512 (run the op then).
    Only use it where ``int4_mm_matches_torch()``: the equality holds for torch's AVX-512
    kernel, the one it dispatches on such a CPU."""
    return _int4_call(library().rg_int4_mm, x, packed, scales_and_zeros, group, threads)


def int4_mm_amx(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor,
                group: int, threads: int | None = None) -> torch.Tensor | None:
    """The same product on AMX tiles (``native_int4_amx.c``): bf16-rounded weights, float32
    sums, each row's result independent of the others; None without AMX."""
    return _int4_call(library().rg_int4_mm_amx, x, packed, scales_and_zeros, group, threads)


@functools.cache
def has_amx_int4() -> bool:
    """The AMX int4 kernel is built and the kernel granted the tile state."""
    lib = library()
    return lib is not None and bool(lib.rg_amx_init())


@functools.cache
def int4_mm_matches_torch() -> bool:
    """``int4_mm`` is built and gives torch's int4 op's bits on this machine (checked once,
    on a small random product: torch's kernel differs by CPU capability and could change
    between versions)."""
    if library() is None or not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return False
    gen = torch.Generator().manual_seed(0)
    n, k, rows = 128, 64, 13
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 8)
    sz = (torch.randn(k // 32, n, 2, generator=gen) / 8).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    try:
        ours = int4_mm(x, packed, sz, 32, threads=1)
    except ValueError:
        return False
    if ours is None:
        return False
    theirs = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, sz)
    if not torch.equal(ours.view(torch.int16), theirs.view(torch.int16)):
        log.warning("native int4 matmul differs from torch's int4 op here: torch's op instead")
        return False
    return True


FIXED_GROUP = 32


def int4_fixed_pack(codes: torch.Tensor, scale: torch.Tensor,
                    zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """int4 weights ``W = (codes - 8) * scale + zero`` (codes [N, K] 0..15, scale and zero
    [N, K/32]) in ``native_int4_fixed.c``'s layout: codes uint8 [N/16, K/32, 4, 16, 4] (two
    a byte) and ``d = scale``, ``m = zero - 8 scale`` float16 [N/16, K/32, 2, 16]. None where
    the shape is not taken (N a multiple of 64, K of 32) or d and m do not fit float16
    (beyond its range, or a nonzero value lost to underflow)."""
    n, k = codes.shape
    if n % 64 or k % FIXED_GROUP:
        return None
    groups = k // FIXED_GROUP
    d = scale.float()
    m = zero.float() - 8 * d
    dm = torch.stack([d, m]).view(2, n // 16, 16, groups).permute(1, 3, 0, 2)   # [N/16, G, 2, 16]
    half = dm.to(torch.float16)
    if not torch.isfinite(half).all() or ((half == 0) & (dm != 0)).any():
        return None
    c = codes.to(torch.uint8).view(n // 16, 16, groups, 4, 2, 4).permute(0, 2, 3, 4, 1, 5)
    packed = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).contiguous()              # [N/16, G, 4, 16, 4]
    return packed, half.contiguous()


def int4_fixed_from_q4(parts: list, q4_1: list[bool]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """GGUF Q4_0 / Q4_1 blocks (each part uint8 [rows, K/32, 18 or 20], rows in the model's
    order, stacked along the rows) straight into ``int4_fixed_pack``'s layout, its very bits
    (``native_int4_fixed.c``: no codes tensor in between, the loader's slowest step). None
    where the shape is not taken or a scale does not fit float16."""
    n, k = sum(p.shape[0] for p in parts), parts[0].shape[1] * FIXED_GROUP
    if n % 64 or any(p.shape[0] % 16 or p.shape[1] * FIXED_GROUP != k for p in parts):
        return None
    packed = torch.empty((n // 16, k // FIXED_GROUP, 4, 16, 4), dtype=torch.uint8)
    dm = torch.empty((n // 16, k // FIXED_GROUP, 2, 16), dtype=torch.float16)
    tile = 0
    for blocks, wide in zip(parts, q4_1):
        blocks = np.ascontiguousarray(blocks)
        if blocks.dtype != np.uint8 or blocks.shape[2] != (20 if wide else 18):
            raise ValueError("blocks must be uint8 [rows, K/32, 20 (Q4_1) or 18 (Q4_0)]")
        if library().rg_int4_fixed_from_q4(blocks.ctypes.data, int(wide), blocks.shape[0], k,
                                           packed[tile].data_ptr(), dm[tile].data_ptr()) != 0:
            return None
        tile += blocks.shape[0] // 16
    return packed, dm


def int4_mm_fixed(x: torch.Tensor, packed: torch.Tensor, dm: torch.Tensor, amx: int = 1,
                  threads: int | None = None) -> torch.Tensor | None:
    """x [M, K] contiguous float32 or bf16 times ``int4_fixed_pack``'s weights -> bf16 [M, N]
    (``native_int4_fixed.c``: activations in fixed point per group of 32, exact integer
    sums, one fixed float combination; a row's bits do not depend on the call's rows nor
    on ``amx``: 1 the tiles above a few rows where the CPU has them, 0 never, -1 always).
    None where the library was built without AVX512-VNNI. Checks its arguments; a layer
    calls its ``FixedInt4`` instead."""
    k = x.shape[1]
    if x.dtype not in (torch.float32, torch.bfloat16) or not x.is_contiguous():
        raise ValueError("x must be a contiguous float32 or bf16 [M, K] tensor")
    if packed.shape != (packed.shape[0], k // FIXED_GROUP, 4, 16, 4) or k % FIXED_GROUP \
            or dm.dtype != torch.float16:
        raise ValueError(f"weights do not match x's {k} columns")
    return FixedInt4(packed, dm)(x, amx, threads)


class FixedInt4:
    """One layer's weights in ``int4_fixed_pack``'s layout with the call's constant arguments
    bound once (a decode step makes ~120 of these calls: ``int4_mm_fixed``'s checks cost a
    third of a one-row call)."""

    def __init__(self, packed: torch.Tensor, dm: torch.Tensor):
        self.packed, self.dm = packed, dm
        self.n, self.k = packed.shape[0] * 16, packed.shape[1] * FIXED_GROUP
        self._call = library().rg_int4_mm_fixed
        self._weights = (packed.data_ptr(), dm.data_ptr())

    def __call__(self, x: torch.Tensor, amx: int = 1, threads: int | None = None
                 ) -> torch.Tensor | None:
        """x [M, K] contiguous float32 or bf16 (the caller's contract) -> bf16 [M, N]; None
        where the library was built without AVX512-VNNI."""
        rows = x.shape[0]
        out = torch.empty((rows, self.n), dtype=torch.bfloat16)
        if rows == 0:
            return out
        status = self._call(x.data_ptr(), x.dtype is torch.bfloat16, *self._weights,
                            out.data_ptr(), rows, self.n, self.k, amx,
                            default_threads() if threads is None else threads)
        if status == -4:
            return None
        if status:
            _check_status(status, "", f"shape not taken: N {self.n} (a multiple of 64), "
                                      f"K {self.k} (of 32)")
        return out


@functools.cache
def has_int4_fixed() -> bool:
    """``int4_mm_fixed`` is built here (the CPU has AVX512-VNNI)."""
    if library() is None:
        return False
    packed = int4_fixed_pack(torch.zeros(64, 32, dtype=torch.int32), torch.ones(64, 1),
                             torch.zeros(64, 1))
    return int4_mm_fixed(torch.zeros(1, 32), *packed, threads=1) is not None


@functools.cache
def int4_fixed_has_amx() -> bool:
    lib = library()
    return lib is not None and bool(lib.rg_int4_fixed_has_amx())
