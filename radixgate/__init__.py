"""radixgate: a prompt-prefix caching inference gateway.

Subpackages: radix_cache (pure-Python cache core), kernels (paged attention ops),
runtime (model + engine), gateway (HTTP APIs and the ``radixgate`` CLI).

The subpackages live in the repository's top-level folders; this folder links to them
(``radixgate/gateway -> ../gateway`` ...), so the import name ``radixgate.gateway`` and the
folder ``gateway/`` are the same files for the interpreter and for static tools alike.
"""

import os as _os

# torch's CPU workers (libgomp) spin-wait between parallel regions; by default for ~300,000
# turns (~3 ms), which collapses decode when another process takes a core. 30,000 (~0.3 ms)
# still spans the gaps between the ~150 regions of a decode step (1,000 did not: each region
# then paid a futex wake-up, 0.9x single-stream speed on idle cores), and the engine runs on
# one thread while other processes keep a core busy (runtime/cpu_threads.ThreadGovernor).
# libgomp reads this when torch is first imported; a value the user set wins.
_os.environ.setdefault("GOMP_SPINCOUNT", "30000")
