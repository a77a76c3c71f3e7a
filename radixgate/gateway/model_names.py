"""Other names clients use for the served model: its Hugging Face id and its file name.

For a GGUF file the Hugging Face id is ``general.organization`` + the file's stem without
its quantization suffix (``HuggingFaceTB/SmolLM2-135M-Instruct`` for
``SmolLM2-135M-Instruct.Q4_1.gguf``); for an HF folder, ``config.json``'s
``_name_or_path``, else the folder's name.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

_QUANT_SUFFIX = re.compile(r"[.-](?:I?Q\d[\w]*|F16|F32|BF16)$", re.IGNORECASE)


def model_names(path: str) -> tuple[str, ...]:
    """The names ``path`` (a .gguf file or an HF folder) is known by; () when unreadable."""
    p = Path(path)
    try:
        if p.is_file() and p.suffix == ".gguf":
            return _gguf_names(p)
        if p.is_dir():
            return _folder_names(p)
    except (OSError, ValueError):
        return ()
    return ()


def _gguf_names(path: Path) -> tuple[str, ...]:
    from radixgate.runtime.model.gguf_file import GGUFFile
    metadata = GGUFFile(path, load_tensors=False).metadata
    stem = _QUANT_SUFFIX.sub("", path.stem)
    organization = metadata.get("general.organization")
    names = [f"{organization}/{stem}"] if isinstance(organization, str) and organization else []
    return tuple(dict.fromkeys([*names, stem, path.name, path.stem]))


def _folder_names(path: Path) -> tuple[str, ...]:
    config = path / "config.json"
    names = []
    if config.is_file():
        declared = json.loads(config.read_text()).get("_name_or_path")
        if isinstance(declared, str) and declared:
            names.append(declared)
    return tuple(dict.fromkeys([*names, path.name]))
