"""radixgate: a prompt-prefix caching inference gateway.

Subpackages: radix_cache (pure-Python cache core), kernels (paged attention ops),
runtime (model + engine), gateway (HTTP APIs and the ``radixgate`` CLI).

The subpackages live in the repository's top-level folders; this folder links to them
(``radixgate/gateway -> ../gateway`` ...), so the import name ``radixgate.gateway`` and the
folder ``gateway/`` are the same files for the interpreter and for static tools alike.
"""
