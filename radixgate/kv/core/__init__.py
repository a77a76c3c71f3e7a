"""The torch-free core of the KV package: the block pool, the radix tree of token prefixes
(nodes, namespaces, pins, eviction policies, integrity checks). Importing it never imports torch."""
