"""Importing the cache core must stay cheap: no torch."""

import subprocess
import sys


def test_importing_radix_cache_does_not_import_torch():
    code = ("import sys, radixgate.radix_cache as rc; rc.RadixTree(rc.BlockPool(4, 16)); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
