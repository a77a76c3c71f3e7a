"""Importing the cache core must stay cheap: no torch."""

import subprocess
import sys


def test_importing_the_kv_core_does_not_import_torch():
    code = ("import sys, radixgate.kv as rc; import radixgate.kv.tiers.index, "
            "radixgate.kv.events.blocks, radixgate.kv.groups.window_plan; "
            "rc.RadixTree(rc.BlockPool(4, 16)); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
