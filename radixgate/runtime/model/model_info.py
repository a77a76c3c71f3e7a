"""``ModelInfo``: what a client of an engine knows of its model, without its weights
(made by ``loader.read_model_info`` or ``LoadedModel.info``). Imports no torch."""
from __future__ import annotations

from dataclasses import dataclass

from radixgate.runtime.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class ModelInfo:
    """What a client of an engine knows of its model, no weights: the tokenizer, the
    model's name and path, the logits' width (``vocab_size``, may exceed the tokenizer's)
    and the context window (``max_model_len``)."""

    tokenizer: Tokenizer
    name: str
    path: str
    vocab_size: int
    max_model_len: int
