"""The Triton kernels compile for sm_90 and sm_80 (cubin via Triton's ptxas) without register
spills, checked on a machine with no GPU. Slow (about a minute): run with ``-m slow``."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed")

pytestmark = pytest.mark.slow


def test_kernels_compile_for_hopper_and_ampere_without_spills():
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not any(os.path.exists(os.path.join(bin_dir, n)) for n in ("ptxas", "ptxas-blackwell")):
        pytest.skip("triton's bundled ptxas is missing")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "radixgate.kernels.compile_check", "--arch", "90", "80"],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "_decode_kernel" in result.stdout and "_prefill_kernel" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "max spill bytes: 0", result.stdout
