"""The model fingerprint: the seed of every tier address (radix_cache/block_hash.py).

It covers what the K/V numbers depend on: the weights (the file's or folder's identity:
path, sizes, modification times; plus a digest of a few embedding rows, which tells
seeded random weights apart), the model's shape and dtypes, the KV dtype and layout, the
block size and the tier's record format. Any change reads nothing of the old records.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from .records import FORMAT_VERSION


def model_fingerprint(loaded, kv) -> bytes:
    """16 bytes for ``loaded`` (a LoadedModel) and ``kv`` (its KVCache)."""
    identity = {
        "format": FORMAT_VERSION,
        "name": loaded.name,
        "weights": weights_identity(loaded.path),
        "probe": _embedding_probe(loaded.model),
        "config": repr(loaded.config),
        "weights_dtype": loaded.weights_dtype,
        "dtype": str(loaded.dtype),
        "kv": [kv.kv_dtype, kv.num_layers, kv.num_kv_heads, kv.head_dim, kv.block_size,
               kv.slot_bytes()],
    }
    data = json.dumps(identity, sort_keys=True).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


def weights_identity(path: str) -> list:
    """(name, size, mtime_ns) of the weights file, or of each file of a model folder."""
    p = Path(path)
    try:
        files = sorted(q for q in p.iterdir() if q.is_file()) if p.is_dir() else [p]
        return [[str(q.resolve()), *_size_and_time(q)] for q in files]
    except OSError:
        return [str(path)]


def _size_and_time(path: Path) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def _embedding_probe(model) -> str:
    with torch.no_grad():
        rows = model.embed(torch.arange(8, device=model.device))
    return hashlib.blake2b(rows.float().cpu().numpy().tobytes(), digest_size=16).hexdigest()
