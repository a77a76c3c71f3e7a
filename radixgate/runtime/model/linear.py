"""The model's matmuls ``x [M, K] @ W^T -> [M, N]`` with the weight kept in one form only: float32
or bfloat16 (oneDNN-packed on the CPU), int8 (per-output-row scale) or int4 (per-32-group scale
and zero), and ``resolve_weights_dtype``, which picks the form for ``--weights-dtype auto``.

Measured on this project's CPU (AVX-512 + AVX512-BF16, torch 2.13, 1 thread, the 30 layers of
SmolLM2-135M each a distinct weight so nothing stays in cache; ms for all 30 layers' q/k/v, o,
gate_up and down together; the f32 and bf16-packed columns scaled up from gate_up + down, 75%
of the weights):

    rows   f32 F.linear  f32 packed  bf16 packed  int8 op  int4 op  int4 -> bf16 GEMM
    1           25           13          6.8        6.7      3.9        -
    16          56           23          13         23.3     20.6      185
    64          -            -           39*        86.2     78.7      192
    512        1107         440          221        674      614       354   (* plain bf16)

(The last column predates the three-pass ``dequantized_t``: the dequantization alone is now
52 ms for all 120 matmuls of the default model, was 265, so that path gains ~200 ms a step.)

lm_head [49152, 576], 1 / 16 rows: f32 packed 3.3 / 7.5 ms, bf16 packed 1.6 / 3.4, int8 op
1.6 / 6.8. The int8 / int4 ops take bfloat16 activations (with float32 ones they fall back to
scalar code, 20-100x slower); oneDNN's packed layout beats F.linear even at one row, so it is the
only copy of a dense weight (a tied head shares the embedding's plain table instead).

``native(x)`` returns the product in the op's own dtype (bfloat16 for int8 / int4 / bf16
weights), for a caller whose next op casts or promotes anyway; calling the layer casts it
back to ``x``'s dtype.

int4 on a CPU with AVX512-VNNI (where ``native.has_int4_fixed()``; every AMX CPU has it): the
layer keeps only ``native_int4_fixed.c``'s layout and runs that kernel at every row count in
both modes: exact integer group sums over fixed-point activations, so a row's bits never depend
on the call's rows (Sapphire Rapids, 2 threads, 3072 x 576: one row 0.019 ms against torch's op
0.043, 16 rows 0.11 against 0.31, 2,048 rows 8.3 against the op's 41.9 and the dequantized bf16
GEMM's ~4). Q4_0 / Q4_1 scales and offsets are kept as float16 (GGUF's own precision); a layer
whose scales do not fit float16, or a CPU without VNNI, keeps torch's pack as below.

Per call with torch's pack: int4 runs the int4 op up to ``INT4_OP_MAX_ROWS`` rows and above that dequantizes the
layer (from the packed codes) for one GEMM; on a CPU with AMX, from ``AMX_INT4_MIN_ROWS`` + 1
rows on, our tile kernel instead (``kernels.native.int4_mm_amx``: the GEMM's bf16 products,
the layer dequantized inside the call; Sapphire Rapids, 2 threads, 576 x 3072: 0.14 ms
at 16 rows against the op's 0.30, 0.21 at 64 against 1.21, 3.7 ms at 2,048 against the
dequantized GEMM's 3.1; at one row 0.15 against the op's 0.045, hence the op below); int8 runs its op up to ``INT8_OP_MAX_ROWS`` and a
GEMM over the converted codes above. That GEMM is bf16 where the CPU has bf16 hardware and
float32 elsewhere (``wide_gemm_dtype``; Ice Lake, 2 threads, 2048 x 576 x 3072: bf16 133 ms,
float32 36 ms).

``auto`` (no timing run at start; CPU flags from /proc/cpuinfo at run time):

    model's linear weights            CPU                          weights
    Q4_0 / Q4_1 (4-bit blocks)        int4 op present (AVX2/512)   int4 (head: see below)
    Q8_0, F16, BF16, F32, HF dirs     AVX512-BF16 or AMX-BF16      bfloat16
    anything else, --tiny, non-CPU    -                            float32

int4 wins single-stream decode (3.9 against 7.5 ms a token for the layers) and loses 16 rows
(1.5x) and prefill (1.5x) to bf16; decode of few streams is what the default model serves.
Q4_0 / Q4_1 codes go into int4 exactly (float32 scale and zero; the op rounds them to bf16);
a GGUF file's head becomes radixgate/runtime/model/head.py's ``RescoredHead`` (int8 x int8 with each row's top
logits recomputed exactly; 4-bit would be lossy), any other head bf16.

Deterministic mode (``native(x, invariant=True)``, from a ``ForwardBatch`` with ``deterministic``):
a row's product must not depend on how many rows the call has. Measured with torch 2.13 on
the CPU (a row alone against the same row among M others, 1 and 2 threads): torch's int4 op
is row-invariant at every M (the same K loop for every row block), the dequantized GEMM above
``INT4_OP_MAX_ROWS`` is not; the int8 op is up to 16 rows; oneDNN's packed float32 / bf16
GEMM and ``F.linear`` pick their K blocking by M (576 x 1536 differs between 1 and 2 rows)
but give a row the same bits at a fixed M wherever it sits in the call. So the mode runs:
int4, the op's arithmetic at every row count: the op itself up to ``NATIVE_INT4_MIN_ROWS`` rows,
above that ``kernels.native.int4_mm``, which gives the op's very bits with each weight panel
dequantized once per 96 rows (2,048 x 576 x 3,072, 2 threads, Sapphire Rapids: 23.6 against
the op's 41.8 ms and a float32 GEMM's 20.0; the op alone was 91 against 58 ms on Ice Lake;
where the kernel is missing or differs from the op, the op at every count); int8, the op on chunks of ``INT8_OP_MAX_ROWS``; float weights, GEMMs of
exactly ``INVARIANT_TILE`` rows, the last chunk padded with zeros.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from radixgate.kernels import native

WEIGHTS_DTYPES = ("auto", "float32", "bfloat16", "int8", "int4")
GROUP = 32                    # int4 group size: GGUF's block of 32 values
INT4_OP_MAX_ROWS = 64         # above: dequantize the layer to bf16 and run one GEMM
INT8_OP_MAX_ROWS = 16
_PACK_ROWS_HINT = 16          # the row count oneDNN tunes the packed layout for
_INT4_TILE = 64               # the CPU int4 pack interleaves rows in tiles of 64
INVARIANT_TILE = 16           # deterministic mode: float GEMMs always see this many rows
NATIVE_INT4_MIN_ROWS = 16     # deterministic mode: above, int4 through kernels.native.int4_mm
AMX_INT4_MIN_ROWS = 8         # default mode on AMX: above, int4 through kernels.native.int4_mm_amx


def in_row_chunks(fn, x: torch.Tensor, rows: int, pad: bool = False) -> torch.Tensor:
    """``fn`` over x [M, K] in chunks of ``rows`` rows, concatenated; ``pad``: the last
    chunk filled up with zero rows, so that ``fn`` only ever sees exactly ``rows`` rows. No
    rows (a prefill chunk whose logits nobody reads) gives fn's columns and no rows."""
    if x.shape[0] == 0:
        return fn(x.new_zeros((rows if pad else 1, *x.shape[1:])))[:0]
    if x.shape[0] <= rows and not (pad and x.shape[0] < rows):
        return fn(x)
    outs = []
    for start in range(0, x.shape[0], rows):
        chunk = x[start:start + rows]
        if pad and chunk.shape[0] < rows:
            filled = chunk.new_zeros((rows, *chunk.shape[1:]))
            filled[:chunk.shape[0]] = chunk
            outs.append(fn(filled)[:chunk.shape[0]])
        else:
            outs.append(fn(chunk))
    return torch.cat(outs)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``), empty where that file is missing."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def has_bf16_gemm() -> bool:
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def wide_gemm_dtype() -> torch.dtype:
    """The dtype of the GEMM that quantized layers run above their op's row limit (their
    codes dequantized): bfloat16 where the CPU multiplies bf16 in hardware, else float32.
    Without AVX512-BF16 / AMX (Ice Lake, Skylake, Zen 3) oneDNN's bf16 GEMM converts every
    operand to float32 in software: 2048 x 576 x 3072 took 133 ms against 36 ms in float32
    (Ice Lake, 2 threads), so a 2k-token prefill spent ~8 s in bf16 GEMMs against ~2 s."""
    return torch.bfloat16 if has_bf16_gemm() else torch.float32


def has_int4_op() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and \
        torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def has_int8_op() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


@functools.cache
def _packing_works() -> bool:
    """oneDNN's packed linear present and agreeing with F.linear on a small product."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(24, 40, generator=gen), torch.randn(5, 40, generator=gen)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, _PACK_ROWS_HINT)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(out, F.linear(x, w), atol=1e-4, rtol=1e-4))
    except (AttributeError, RuntimeError):
        return False


def resolve_weights_dtype(requested: str, source_kind: str, device: torch.device,
                          dtype: torch.dtype = torch.float32, tiny: bool = False) -> str:
    """The weights dtype to build: ``requested`` itself, or for ``auto`` the table in this
    module's docstring (``--tiny`` and non-CPU devices: the activations' ``dtype``).
    ``source_kind``: ``"4bit"``, ``"8bit"`` or ``"float"`` (the model's matmul weights as
    stored). Raises ValueError for an unknown or unavailable dtype."""
    if requested not in WEIGHTS_DTYPES:
        raise ValueError(f"weights dtype {requested!r}: one of {', '.join(WEIGHTS_DTYPES)}")
    cpu = device.type == "cpu"
    if requested in ("int4", "int8"):
        available = has_int4_op() if requested == "int4" else has_int8_op()
        if not (cpu and available):
            raise ValueError(f"weights dtype {requested} needs torch's CPU {requested} matmul "
                             f"(device {device}, CPU capability "
                             f"{torch.backends.cpu.get_cpu_capability()})")
        return requested
    if requested != "auto":
        return requested
    if tiny or not cpu:
        return str(dtype).removeprefix("torch.")
    if source_kind == "4bit" and has_int4_op():
        return "int4"
    return "bfloat16" if has_bf16_gemm() else "float32"


class DenseLinear:
    """A float32 or bfloat16 weight [N, K]: on the CPU only oneDNN's packed copy is kept
    (``pack=False`` keeps the plain tensor, e.g. a head tied to the embedding table)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = True):
        self.shape, self.dtype, self.bias = tuple(weight.shape), weight.dtype, bias
        self.weight, self.packed = weight, None
        if pack and weight.device.type == "cpu" and _packing_works() and \
                weight.dtype in (torch.float32, torch.bfloat16):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS_HINT)
            self.weight = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.native(x).to(x.dtype)

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype ``native`` casts x to (an x already in it is not copied)."""
        return self.dtype

    def native(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """The product in the weight's dtype (no cast back to ``x``'s); ``invariant``: GEMMs
        of exactly ``INVARIANT_TILE`` rows (the module docstring's deterministic mode)."""
        if invariant:
            return in_row_chunks(self._product, x, INVARIANT_TILE, pad=True)
        return self._product(x)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        xw = x.to(self.dtype)
        if self.packed is None:
            return F.linear(xw, self.weight, None if self.bias is None else self.bias.to(self.dtype))
        out = torch.ops.mkldnn._linear_pointwise(xw.contiguous(), self.packed, None, "none", [], "")
        return out if self.bias is None else out + self.bias

    @property
    def nbytes(self) -> int:
        n, k = self.shape
        return n * k * self.dtype.itemsize


class Int8Linear:
    """int8 codes [N, K] with one scale per output row: ``W = codes * scale[:, None]``."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        assert codes.dtype == torch.int8 and scale.shape == (codes.shape[0],)
        self.codes, self.bias = codes.contiguous(), bias
        self.scale = scale.to(torch.bfloat16)             # [N] the op takes x's dtype
        self.shape, self.dtype = tuple(codes.shape), torch.int8
        self.wide_dtype = wide_gemm_dtype()                # above INT8_OP_MAX_ROWS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.native(x).to(x.dtype)

    input_dtype = torch.bfloat16          # what ``native`` casts x to

    def native(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """The product in bfloat16, the op's own dtype (float32 above the op's row limit on
        a CPU without bf16 GEMMs, or with a float32 bias); ``invariant``: the op on chunks of
        ``INT8_OP_MAX_ROWS`` rows whatever the count."""
        xb = x.to(torch.bfloat16).contiguous()             # [M, K]
        if invariant:
            out = in_row_chunks(lambda rows: torch.ops.aten._weight_int8pack_mm(
                rows, self.codes, self.scale), xb, INT8_OP_MAX_ROWS)
        elif x.shape[0] <= INT8_OP_MAX_ROWS:
            out = torch.ops.aten._weight_int8pack_mm(xb, self.codes, self.scale)
        else:
            wide = self.wide_dtype
            out = F.linear(xb.to(wide), self.codes.to(wide)) * self.scale.to(wide)
        return out if self.bias is None else out + self.bias

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 2 * self.scale.numel()


def quantize_int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (codes int8 [N, K], scale float32 [N])."""
    scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)         # [N]
    codes = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return codes, scale


class Int4Linear:
    """4-bit codes [N, K] (0..15) in groups of 32 along K with a scale and a zero each:
    ``W[n, k] = (codes[n, k] - 8) * scale[n, k // 32] + zero[n, k // 32]``; only torch's
    packed form of the codes is kept."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                 bias: torch.Tensor | None = None, fixed: bool | None = None):
        """``fixed``: keep the codes in ``native_int4_fixed.c``'s layout (None: where that
        kernel is built, the CPU has AVX512-VNNI, and the shape and scales fit it)."""
        n, k = codes.shape
        assert k % GROUP == 0 and scale.shape == zero.shape == (n, k // GROUP)
        if fixed is None:
            fixed = codes.device.type == "cpu" and native.has_int4_fixed()
        pack = native.int4_fixed_pack(codes, scale, zero) if fixed else None
        self._hold((n, k), pack, bias)
        if pack is None:
            self._torch_pack(codes, scale, zero)

    @classmethod
    def from_fixed(cls, fixed: tuple[torch.Tensor, torch.Tensor],
                   bias: torch.Tensor | None = None) -> "Int4Linear":
        """A layer over weights already in the fixed layout (``native.int4_fixed_from_q4``)."""
        layer = cls.__new__(cls)
        packed, _ = fixed
        layer._hold((packed.shape[0] * 16, packed.shape[1] * GROUP), fixed, bias)
        return layer

    def _hold(self, shape: tuple[int, int], fixed: tuple | None, bias) -> None:
        """The attributes every layer has: the fixed layout's kernel where given, torch's
        pack (``_torch_pack``) still to come otherwise."""
        self.shape, self.dtype, self.bias = shape, torch.quint4x2, bias
        self._fixed_mm = native.FixedInt4(*fixed) if fixed is not None else None
        self.packed = self.scales_and_zeros = None
        self.native_op = self.amx = False

    @property
    def fixed(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The fixed layout's (codes, d and m), or None where the layer keeps torch's pack."""
        mm = self._fixed_mm
        return None if mm is None else (mm.packed, mm.dm)

    def _torch_pack(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> None:
        """torch's CPU int4 pack, for its op, ``native.int4_mm`` and ``native.int4_mm_amx``."""
        n, k = codes.shape
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            codes.to(torch.int32).contiguous(), 8)                     # uint8 [N, K/2]
        self.scales_and_zeros = torch.stack([scale, zero], -1).transpose(0, 1) \
            .contiguous().to(torch.bfloat16)                           # [K/32, N, 2]
        self.wide_dtype = wide_gemm_dtype()                            # above INT4_OP_MAX_ROWS
        # the deterministic mode's many-row product: the op's bits, 1.8x faster at 2k rows
        self.native_op = n % _INT4_TILE == 0 and codes.device.type == "cpu" \
            and native.int4_mm_matches_torch()
        # the default mode from a few rows on, on an AMX CPU: 2-6x the op at 16-64 rows
        self.amx = n % _INT4_TILE == 0 and k % 32 == 0 and codes.device.type == "cpu" \
            and "amx_bf16" in cpu_flags() and native.has_amx_int4()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.native(x).to(x.dtype)

    input_dtype = torch.bfloat16          # what ``native`` casts x to (the fixed layout: none)

    def native(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """The product in bfloat16, the op's own dtype (float32 above the op's row limit on
        a CPU without bf16 GEMMs, or with a float32 bias). The fixed layout: one kernel at
        every row count in both modes, a row's bits independent of the call (float32 or
        bf16 activations as they come). torch's pack: activations rounded to bf16 on every
        path; ``invariant``: the op's arithmetic at every row count."""
        if self._fixed_mm is not None:
            if x.dtype is not torch.bfloat16 and x.dtype is not torch.float32:
                x = x.float()
            out = self._fixed_mm(x.contiguous())
            return out if self.bias is None else out + self.bias
        xb = x.to(torch.bfloat16).contiguous()                          # [M, K]
        if invariant and x.shape[0] > NATIVE_INT4_MIN_ROWS and self.native_op:
            out = native.int4_mm(xb, self.packed, self.scales_and_zeros, GROUP)
        elif not invariant and x.shape[0] > AMX_INT4_MIN_ROWS and self.amx:
            out = native.int4_mm_amx(xb, self.packed, self.scales_and_zeros, GROUP)
        elif x.shape[0] <= INT4_OP_MAX_ROWS or self.shape[0] % _INT4_TILE or invariant:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, GROUP,
                                                             self.scales_and_zeros)
        else:
            wide = self.wide_dtype
            out = xb.to(wide) @ self.dequantized_t(wide)                 # [M, N]
        return out if self.bias is None else out + self.bias

    def dequantized_t(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """W^T [K, N] in ``dtype`` (bf16 or float32) from the packed codes. The CPU pack stores tile t (rows 64t..64t+63)
        as [K, 32] bytes: low nibble row 64t + j, high nibble row 64t + 32 + j (test-checked).
        Three passes over the layer: each nibble half into one bf16 code buffer, then one
        ``addcmul`` written straight into W^T's layout (a cat and a transposing copy made it
        5x slower: 265 against 52 ms for the default model's 120 matmuls)."""
        if self.fixed is not None:
            return self._fixed_weight().t().to(dtype)
        n, k = self.shape
        tiles_n, half = n // _INT4_TILE, _INT4_TILE // 2
        tiles = self.packed.view(tiles_n, k, half)                      # [N/64, K, 32]
        codes = torch.empty(tiles_n, k, _INT4_TILE, dtype=dtype, device=tiles.device)
        codes[..., :half].copy_(tiles & 15)
        codes[..., half:].copy_(tiles >> 4)                              # [N/64, K, 64]
        sz = self.scales_and_zeros.view(k // GROUP, tiles_n, 1, _INT4_TILE, 2) \
            .transpose(0, 1).to(dtype)                                  # [N/64, K/32, 1, 64, 2]
        scale, zero = sz[..., 0].contiguous(), (sz[..., 1] - 8 * sz[..., 0]).contiguous()
        w_t = torch.empty(k, n, dtype=dtype, device=tiles.device)       # [K, N]
        into = w_t.view(k // GROUP, GROUP, tiles_n, _INT4_TILE).permute(2, 0, 1, 3)
        torch.addcmul(zero, codes.view(tiles_n, k // GROUP, GROUP, _INT4_TILE), scale, out=into)
        return w_t

    def _fixed_weight(self) -> torch.Tensor:
        """W [N, K] float32 from the fixed layout (``code * d + m``, the kernel's weights)."""
        n, k = self.shape
        packed, dm = self.fixed                                        # [N/16, G, 4, 16, 4]
        codes = torch.stack([packed & 15, packed >> 4], 3)              # [N/16, G, 4, 2, 16, 4]
        codes = codes.permute(0, 4, 1, 2, 3, 5).reshape(n, k).float()
        d, m = (dm[:, :, i].permute(0, 2, 1).reshape(n, k // GROUP).float() for i in (0, 1))
        return (codes.view(n, k // GROUP, GROUP) * d[..., None] + m[..., None]).view(n, k)

    @property
    def nbytes(self) -> int:
        if self.fixed is not None:
            return sum(t.numel() * t.element_size() for t in self.fixed)
        return self.packed.numel() + 2 * self.scales_and_zeros.numel()


def quantize_int4_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 in groups of 32 (min/max): codes uint8 [N, K], scale and zero [N, K/32]."""
    n, k = weight.shape
    groups = weight.float().view(n, k // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)                        # [N, K/32]
    scale = ((high - low) / 15).clamp(min=1e-12)
    codes = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    return codes.to(torch.uint8).view(n, k), scale, low + 8 * scale


Linear = DenseLinear | Int8Linear | Int4Linear
