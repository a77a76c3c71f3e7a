"""A fast GGUF container reader: metadata dict + memory-mapped tensor bytes.

``gguf.GGUFReader`` builds one numpy memmap view per string, which takes ~4-7 s for the
49,152-token vocabulary of the default model on this CPU; reading the same header with
``struct`` takes ~0.1 s. The format (GGUF v2/v3, little-endian) is: magic, version,
tensor count, KV count; KV pairs; tensor infos (name, dims, type, offset); padding to
``general.alignment``; tensor data. Type constants come from the ``gguf`` package.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]      # torch order (ggml's ne reversed): [rows, cols]
    qtype: GGMLQuantizationType
    data: np.ndarray            # uint8 view of the raw bytes (memory-mapped)
    file: GGUFFile | None = field(default=None, repr=False, compare=False)


class GGUFFile:
    """``metadata`` (str -> python value; arrays become lists or numpy arrays) and
    ``tensors`` (name -> TensorInfo). Tensor data stays memory-mapped."""

    def __init__(self, path: str | Path, *, load_tensors: bool = True):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            if f.seek(0, 2) < 24:
                raise ValueError(f"{self.path} is not a GGUF file")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._buf = np.frombuffer(self._map, dtype=np.uint8)
        self._mv = memoryview(self._buf)
        self._pos = 0
        if bytes(self._mv[:4]) != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file")
        self.version, n_tensors, n_kv = struct.unpack_from("<IQQ", self._mv, 4)
        if self.version < 2:
            raise ValueError(f"GGUF version {self.version} is not supported (need >= 2)")
        self._pos = 24
        self.metadata = dict(self._read_kv() for _ in range(n_kv))
        self.tensors: dict[str, TensorInfo] = {}
        if load_tensors:
            self._read_tensor_infos(n_tensors)

    # --- primitives ---
    def _unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self._mv, self._pos)[0]
        self._pos += struct.calcsize(fmt)
        return value

    def _read_str(self) -> str:
        return self._read_strings(1)[0]

    def _read_strings(self, count: int) -> list[str]:
        """``count`` length-prefixed UTF-8 strings in a row (a vocabulary: ~100k at start) in
        one loop: the default model's header reads in 48 ms, was 56 with a call per string."""
        mv, pos, out = self._mv, self._pos, []
        from_bytes = int.from_bytes
        for _ in range(count):
            n = from_bytes(mv[pos:pos + 8], "little")
            pos += 8
            out.append(str(mv[pos:pos + n], "utf-8", "replace"))
            pos += n
        self._pos = pos
        return out

    def _read_value(self, vtype: int):
        vtype = GGUFValueType(vtype)
        if vtype == GGUFValueType.STRING:
            return self._read_str()
        if vtype == GGUFValueType.ARRAY:
            return self._read_array()
        return self._unpack(_SCALAR[vtype])

    def _read_array(self):
        etype, count = GGUFValueType(self._unpack("<I")), self._unpack("<Q")
        if etype == GGUFValueType.STRING:
            return self._read_strings(count)
        if etype == GGUFValueType.ARRAY:
            return [self._read_array() for _ in range(count)]
        dtype = np.dtype(_SCALAR[etype])
        arr = np.frombuffer(self._buf, dtype=dtype, count=count, offset=self._pos).copy()
        self._pos += dtype.itemsize * count
        return arr

    def _read_kv(self):
        key = self._read_str()
        return key, self._read_value(self._unpack("<I"))

    def _read_tensor_infos(self, n_tensors: int) -> None:
        infos = []
        for _ in range(n_tensors):
            name = self._read_str()
            n_dims = self._unpack("<I")
            ne = struct.unpack_from(f"<{n_dims}Q", self._mv, self._pos)
            self._pos += 8 * n_dims
            qtype, offset = GGMLQuantizationType(self._unpack("<I")), self._unpack("<Q")
            infos.append((name, ne, qtype, offset))
        align = int(self.metadata.get("general.alignment", 32))
        start = self.data_offset = -(-self._pos // align) * align
        for name, ne, qtype, offset in infos:
            block_elems, type_size = GGML_QUANT_SIZES[qtype]
            nbytes = int(np.prod(ne)) // block_elems * type_size
            data = self._buf[start + offset:start + offset + nbytes]
            self.tensors[name] = TensorInfo(name, tuple(int(x) for x in reversed(ne)), qtype, data,
                                            self)

    def release_resident_pages(self) -> None:
        """Drop the file's pages from this process's resident set (``MADV_DONTNEED`` on the
        read-only mapping: a later read faults a page back in from the page cache). Called
        once the model is built: the layers were copied into torch's packed forms, and the
        ~94 MB of the default model's file stayed counted in RSS; only the embedding rows
        that tokens use come back."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)
