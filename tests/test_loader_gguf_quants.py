"""Dequantization (gguf.quants) against hand-computed blocks; integer codes against it."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from radixgate.runtime.model.gguf_quants import BLOCK_LAYOUT, SUPPORTED_TYPES, dequantize, group_codes

# byte offsets of the fp16 scale fields inside one block of each type
_F16_FIELDS = {QT.Q8_0: [0], QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2],
               QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208]}


def random_blocks(qtype, n_blocks: int, seed: int = 0) -> np.ndarray:
    """Random block bytes whose fp16 scales are finite values in [-1, 1]."""
    rng = np.random.default_rng(seed)
    _, type_size = BLOCK_LAYOUT[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for offset in _F16_FIELDS[qtype]:
        halves = rng.uniform(-1, 1, size=n_blocks).astype(np.float16)
        blocks[:, offset:offset + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    return blocks


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q4_1], ids=lambda q: q.name)
def test_group_codes_rebuild_the_dequantized_values_exactly(qtype):
    blocks = random_blocks(qtype, 48)
    codes, scale, zero = group_codes(blocks.reshape(-1), qtype, (6, 8 * 32))
    groups = codes.reshape(6, 8, 32).astype(np.float32)
    if zero is None:
        rebuilt = groups * scale[..., None]
    else:
        rebuilt = (groups - 8) * scale[..., None] + zero[..., None]
    expected = dequantize(blocks.reshape(-1), qtype, (6, 8 * 32))
    assert expected.dtype == np.float32
    np.testing.assert_allclose(rebuilt.reshape(6, 256), expected, rtol=0, atol=1e-6)


def test_q4_0_block_by_hand_low_nibbles_first():
    block = np.zeros((1, 18), dtype=np.uint8)
    block[0, :2] = np.array([0.5], dtype=np.float16).view(np.uint8)
    block[0, 2:] = 0x9A                       # low nibble 10, high nibble 9
    out = dequantize(block, QT.Q4_0, (32,))
    np.testing.assert_array_equal(out[:16], np.full(16, (10 - 8) * 0.5, dtype=np.float32))
    np.testing.assert_array_equal(out[16:], np.full(16, (9 - 8) * 0.5, dtype=np.float32))


def test_q4_1_block_by_hand_adds_the_minimum():
    block = np.zeros((1, 20), dtype=np.uint8)
    block[0, :4] = np.array([0.25, -1.0], dtype=np.float16).view(np.uint8)
    block[0, 4:] = 0x3F                       # low 15, high 3
    out = dequantize(block, QT.Q4_1, (32,))
    assert out[0] == pytest.approx(15 * 0.25 - 1.0) and out[31] == pytest.approx(3 * 0.25 - 1.0)


def test_q8_0_block_by_hand_is_signed():
    block = np.zeros((1, 34), dtype=np.uint8)
    block[0, :2] = np.array([2.0], dtype=np.float16).view(np.uint8)
    block[0, 2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    np.testing.assert_array_equal(dequantize(block, QT.Q8_0, (32,)), np.arange(-32, 32, 2, dtype=np.float32))


@pytest.mark.parametrize("dtype,qtype", [(np.float32, QT.F32), (np.float16, QT.F16)])
def test_float_tensors_round_trip(dtype, qtype):
    values = np.linspace(-3, 3, 24, dtype=np.float32).astype(dtype)
    out = dequantize(values.view(np.uint8), qtype, (4, 6))
    np.testing.assert_array_equal(out, values.astype(np.float32).reshape(4, 6))


def test_bf16_keeps_the_upper_half_of_float32():
    values = np.array([1.0, -2.5, 3.140625, 1e-3], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    out = dequantize(bf16.view(np.uint8), QT.BF16, (4,))
    np.testing.assert_allclose(out, values, rtol=1e-2)
    assert out[0] == 1.0 and out[1] == -2.5


def test_required_types_are_all_supported():
    assert {QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q6_K} <= SUPPORTED_TYPES


def test_unsupported_type_and_wrong_shape_raise():
    with pytest.raises(NotImplementedError, match="Q2_K"):
        dequantize(np.zeros(84, dtype=np.uint8), QT.Q2_K, (256,))
    with pytest.raises(ValueError, match="shape"):
        dequantize(random_blocks(QT.Q8_0, 2), QT.Q8_0, (3, 32))
