"""Per-request debug record (``EngineConfig.record_logits``) for the near-tie rule of
docs/ARCHITECTURE.md section 7: cache-on vs cache-off comparisons stop at the first step whose top-2 gap is tiny."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class RequestTrace:
    gaps: tuple[float, ...]             # best minus second-best logit, per sampled token
    logits: tuple[torch.Tensor, ...]    # [vocab] float32 per sampled token
