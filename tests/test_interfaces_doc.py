"""docs/INTERFACES.md says only what the code does: every documented signature, base class,
decorator and dataclass field is compared with the real object (tests/support/signature_doc.py),
and the contracts other parts code against are all documented."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.signature_doc import check_block, python_blocks

DOC = Path(__file__).resolve().parent.parent / "docs" / "INTERFACES.md"
BLOCKS = python_blocks(DOC.read_text())

# (module, name) pairs the document must describe: what other parts code against.
REQUIRED = [
    ("radixgate.kv", "BlockPool"), ("radixgate.kv", "RadixTree"),
    ("radixgate.kv", "MatchResult"), ("radixgate.kv", "InsertResult"),
    ("radixgate.kv", "EvictionPolicy"), ("radixgate.kv", "CacheConfig"),
    ("radixgate.runtime.engine.api", "Request"), ("radixgate.runtime.engine.api", "SamplingParams"),
    ("radixgate.runtime.engine.api", "Finished"), ("radixgate.runtime.engine.engine", "Engine"),
    ("radixgate.kv.tiers.disk", "KVTier"), ("radixgate.kv.tiers.disk", "open_disk_tier"),
    ("radixgate.kv.tiers.disk", "TierBackend"), ("radixgate.runtime.model.loader", "load_model"),
]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}-{b.module}" for b in BLOCKS])
def test_documented_signatures_match_the_code(block):
    problems = check_block(block.module, block.source)
    assert not problems, f"docs/INTERFACES.md line {block.line}:\n" + "\n".join(problems)


def test_the_contracts_are_documented():
    documented = {(b.module, name) for b in BLOCKS for name in _defined_names(b.source)}
    assert [pair for pair in REQUIRED if pair not in documented] == []


def _defined_names(source: str) -> set[str]:
    import ast
    return {n.name for n in ast.parse(source).body if hasattr(n, "name")}


DRIFTED = {
    "a parameter": "class BlockPool:\n    def allocate(self, count: int) -> list[int]: ...",
    "a default": "class RadixTree:\n    def pin(self, namespace: str, tokens: Sequence[int], "
                 "ttl_s: float, owner: str='x') -> int: ...",
    "a return": "class BlockPool:\n    def num_free(self) -> bool: ...",
    "a missing method": "class BlockPool:\n    def shrink(self) -> None: ...",
    "a missing class": "class EvictionPolicyDataclass: ...",
    "a base": "class OutOfBlocks(ValueError): ...",
    "a decorator": "@dataclass\nclass MatchResult:\n    length: int\n    blocks: list[int]\n"
                   "    handle: LockHandle\n    last_block_partial: bool",
    "a field default": "@dataclass(frozen=True, slots=True)\nclass CreditParams:\n"
                       "    continuation_ticks: int = 100",
    "a missing field": "@dataclass(frozen=True)\nclass InsertResult:\n    cached_before: int",
    "a protocol method left out": "class EvictionPolicy(Protocol):\n"
                                  "    def bind(self, block_size: int) -> None: ...",
    "an attribute": "class BlockPool:\n    capacity: int",
    "a constant": "PUBLIC_NAMESPACE = 'shared'",
    "an unchecked statement": "import os",
}


@pytest.mark.parametrize("what", DRIFTED)
def test_the_check_sees_drift(what):
    assert check_block("radixgate.kv", DRIFTED[what]), what


def test_the_check_accepts_the_truth():
    assert check_block("radixgate.kv", "class BlockPool:\n    num_blocks: int\n"
                       "    def num_free(self) -> int: ...") == []
