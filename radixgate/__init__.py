"""radixgate: a prompt-prefix caching inference gateway.

Subpackages: kv (the books of KV blocks: the torch-free tree and pool, the manager, the
window pool, the disk tier, KV events), kernels (paged attention ops), runtime (model +
engine), cluster (replicas on Ray Serve), gateway (HTTP APIs and the ``radixgate`` CLI).

The subpackages live here, not at the repository's top level: a bare top-level ``kernels``
(or ``runtime``...) on ``sys.path`` would shadow the installed package of that name for
every importer, as it did transformers' hub ``kernels`` when the tests put the repository
root first.
"""

import os as _os

__version__ = "0.1.0"   # the one version string: the wheel's metadata and ``radixgate --version``

# torch's CPU workers (libgomp) spin-wait between parallel regions; by default for ~300,000
# turns (~3 ms), which collapses decode when another process takes a core. 30,000 (~0.3 ms)
# still spans the gaps between the ~150 regions of a decode step (1,000 did not: each region
# then paid a futex wake-up, 0.9x single-stream speed on idle cores), and the engine runs on
# one thread while other processes keep a core busy (radixgate/runtime/cpu_threads.ThreadGovernor).
# libgomp reads this when torch is first imported; a value the user set wins.
_os.environ.setdefault("GOMP_SPINCOUNT", "30000")

# oneDNN (torch's CPU matmuls: packed linears, bf16 GEMMs, int8 _int_mm) keeps every
# primitive it builds in two LRU caches, its own and ideep's, 1024 entries each by default,
# one entry per matmul shape, i.e. per batch row count: ~0.4-0.9 MB each. Prompts of many
# lengths (a tenant churning cache_salt values computes every prompt afresh) filled them:
# the default model's server grew 647 -> 2323 MB over 2,100 requests and kept it. 64 entries
# hold the row counts a decode loop repeats; a new one costs ~1-2 ms to build. Read when
# torch first builds a primitive; a value the user set wins.
for _name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    _os.environ.setdefault(_name, "64")
