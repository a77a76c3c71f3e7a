"""runtime/model.py's RMSNorm: the one-row layer_norm path equals torch's rms_norm."""
from __future__ import annotations

import pytest
import torch

from radixgate.runtime.model import RMSNorm, rms_norm


@pytest.mark.parametrize("rows,dtype", [(1, torch.float32), (16, torch.float32),
                                        (1, torch.bfloat16)])
def test_every_path_equals_rms_norm(rows, dtype):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(576, generator=gen)
    x = (torch.randn(rows, 576, generator=gen) * 5).to(dtype)
    norm = RMSNorm(weight, 1e-5)
    got, want = norm(x), rms_norm(x, weight, 1e-5)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.allclose(got.float(), want.float(), atol=1e-5, rtol=1e-5)
    assert norm.numel() == 576 and norm.nbytes == weight.nbytes


def test_a_zero_row_gives_zero_not_nan():
    out = RMSNorm(torch.ones(8), 1e-5)(torch.zeros(1, 8))
    assert torch.equal(out, torch.zeros(1, 8))
