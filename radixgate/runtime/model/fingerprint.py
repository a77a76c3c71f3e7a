"""The model fingerprint: the seed of every tier address (radixgate/kv/core/block_hash.py).

It covers what the K/V numbers depend on: the weights (what the file or folder holds:
sizes, a digest of each file's index and of samples of its bytes, never its path or
modification time; plus a digest of a few embedding rows, which tells seeded random
weights apart), the model's shape and dtypes, the KV dtype and layout, the
block size and the tier's record format. Any change reads nothing of the old records.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch


SAMPLES = 16                          # pieces of each weights file read into its identity
SAMPLE_BYTES = 64 << 10
MAX_SAFETENSORS_HEADER = 100 << 20


def model_fingerprint(loaded, kv, format_version: int) -> bytes:
    """16 bytes for ``loaded`` (a LoadedModel), ``kv`` (its KVCache) and the tier's record
    ``format_version``."""
    identity = {
        "format": format_version,
        "name": loaded.name,
        "weights": weights_identity(loaded.path),
        "probe": _embedding_probe(loaded.model),
        "config": repr(loaded.config),
        "weights_dtype": loaded.weights_dtype,
        "dtype": str(loaded.dtype),
        "kv": [kv.kv_dtype, kv.num_layers, kv.num_kv_heads, kv.head_dim, kv.block_size,
               kv.slot_bytes(), kv.part_layers()],
        "window_pool": None if kv.window is None else [sorted(kv.window_layers),
                                                         kv.window.window],
    }
    data = json.dumps(identity, sort_keys=True).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


def weights_identity(path: str) -> list:
    """What the weights are, wherever they lie: per file (the file, or each file of a model
    folder by name within it) its size and a digest of its content's index (a GGUF file's
    header, metadata and tensor table; a safetensors file's header) and of a few samples of
    its bytes. Moving, copying or touching the file keeps it; other weights change it."""
    p = Path(path)
    try:
        files = sorted(q for q in p.iterdir() if q.is_file()) if p.is_dir() else [p]
        return [[q.name if p.is_dir() else "", os.stat(q).st_size, content_digest(q)]
                for q in files]
    except OSError:
        return [str(path)]


def content_digest(path: Path) -> str:
    """blake2b over the file's index (``_index_bytes``) and ``SAMPLES`` evenly spaced
    ``SAMPLE_BYTES`` pieces of it (the whole file when it is smaller than that)."""
    size = os.stat(path).st_size
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as source:
        digest.update(_index_bytes(source, size))
        if size <= SAMPLES * SAMPLE_BYTES:
            source.seek(0)
            digest.update(source.read())
        else:
            for k in range(SAMPLES):
                source.seek((size - SAMPLE_BYTES) * k // (SAMPLES - 1))
                digest.update(source.read(SAMPLE_BYTES))
    return digest.hexdigest()


def _index_bytes(source, size: int) -> bytes:
    """A GGUF file's bytes before its tensor data, a safetensors file's JSON header, else
    nothing (the samples cover small files whole)."""
    head = source.read(8)
    if head[:4] == b"GGUF":
        source.seek(0)
        return source.read(min(size, _gguf_data_offset(source.name)))
    if len(head) == 8:
        header_len = int.from_bytes(head, "little")
        if 0 < header_len <= min(size - 8, MAX_SAFETENSORS_HEADER):
            return source.read(header_len)
    return b""


def _gguf_data_offset(path: str) -> int:
    from radixgate.runtime.model.gguf_file import GGUFFile
    return GGUFFile(path).data_offset


def _embedding_probe(model) -> str:
    with torch.no_grad():
        rows = model.embed(torch.arange(8, device=model.device))
    return hashlib.blake2b(rows.float().cpu().numpy().tobytes(), digest_size=16).hexdigest()
