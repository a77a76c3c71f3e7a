"""``plural(2, "block")`` -> ``"2 blocks"``, ``plural(1, "block")`` -> ``"1 block"``: counts in
log lines, in words that agree with them."""
from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` and ``noun`` (``nouns``, default ``noun + "s"``, unless ``count`` is 1),
    the count with thousands separators."""
    return f"{count:,} {noun if count == 1 else (nouns or noun + 's')}"
