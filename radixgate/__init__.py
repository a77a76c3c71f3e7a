"""radixgate: a prompt-prefix caching inference gateway.

Subpackages: radix_cache (pure-Python cache core), kernels (paged attention ops),
runtime (model + engine), gateway (HTTP APIs and the ``radixgate`` CLI).

The subpackages live in the repository's top-level folders; this folder links to them
(``radixgate/gateway -> ../gateway`` ...), so the import name ``radixgate.gateway`` and the
folder ``gateway/`` are the same files for the interpreter and for static tools alike.
"""

import os as _os

# torch's CPU workers (libgomp) spin-wait between parallel regions; by default for ~300,000
# turns, which is fastest on idle cores but collapses decode when another process takes a core
# (a spinning worker holds the CPU that the thread it waits for needs: SmolLM2 single-stream
# 110 -> under 5 tok/s with one busy core, the tiny model 30x slower in the test suite). 1,000
# turns keeps 0.93x of the idle speed and 10x more than the default under contention
# (runtime/cpu_threads.py). libgomp reads this when torch is first imported; a value the user
# set wins.
_os.environ.setdefault("GOMP_SPINCOUNT", "1000")
