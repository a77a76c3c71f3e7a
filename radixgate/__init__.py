"""radixgate: a prompt-prefix caching inference gateway.

Subpackages: radix_cache (pure-Python cache core), kernels (paged attention ops),
runtime (model + engine), gateway (HTTP APIs and the ``radixgate`` CLI).
"""
