"""GGUF container reading, config mapping and the Q/K row un-permutation."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from radixgate.runtime.model.gguf_file import GGUFFile
from radixgate.runtime.model.loader_gguf import (config_from_gguf, read_gguf_config,
                                           dequantize_tensor, unpermute_rope_rows)


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What convert_hf_to_gguf.py does to HF q/k rows (written from its definition)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("n_heads,rows,cols", [(9, 576, 8), (3, 192, 5), (4, 64, 0)])
def test_unpermute_inverts_llama_cpp_permutation(n_heads, rows, cols):
    shape = (rows, cols) if cols else (rows,)
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(unpermute_rope_rows(llama_cpp_permute(w, n_heads), n_heads), w)


def test_unpermute_moves_interleaved_pairs_into_halves():
    rows = np.arange(8, dtype=np.float32)[:, None]       # one head, head_dim 8: pairs (0,1) (2,3) ...
    assert unpermute_rope_rows(rows, 1)[:, 0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


@pytest.fixture(scope="module")
def default_gguf(default_model_path):
    return GGUFFile(default_model_path)


def test_default_model_config_from_metadata(default_gguf):
    cfg = config_from_gguf(default_gguf.metadata, default_gguf.tensors.keys())
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.vocab_size == 49152 and cfg.rope_theta == 100000.0
    assert cfg.rms_norm_eps == pytest.approx(1e-5) and cfg.max_position_embeddings == 8192
    assert cfg.tie_word_embeddings and not cfg.attention_bias and cfg.rope_scaling is None
    assert cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,) and cfg.arch == "llama"
    assert read_gguf_config(default_gguf.path) == cfg


@pytest.mark.slow   # gguf.GGUFReader alone takes 4-18 s on 2 cores
def test_fast_reader_agrees_with_gguf_reader(default_gguf):
    from gguf import GGUFReader
    reference = GGUFReader(default_gguf.path)
    for key in ("llama.block_count", "llama.rope.freq_base", "tokenizer.ggml.model",
                "tokenizer.chat_template", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        ours = default_gguf.metadata[key]
        expected = reference.fields[key].contents()
        assert (list(ours) if isinstance(ours, list) else ours) == expected, key
    assert list(default_gguf.metadata["tokenizer.ggml.token_type"]) == \
        reference.fields["tokenizer.ggml.token_type"].contents()
    assert len(default_gguf.tensors) == len(reference.tensors)
    for t in reference.tensors:
        ours = default_gguf.tensors[t.name]
        assert ours.qtype == t.tensor_type and ours.shape == tuple(int(x) for x in reversed(t.shape))
        assert np.array_equal(ours.data, np.asarray(t.data).view(np.uint8).reshape(-1)), t.name


def test_loaded_model_has_every_layer_and_a_tied_head(real_model):
    model = real_model.model
    assert model.embed.shape == (49152, 576) and model.tied
    assert model.logits_proj.shape == (49152, 576)
    assert len(model.layers) == 30
    layer = model.layers[29]
    assert layer.qkv.shape == ((9 + 2 * 3) * 64, 576) and layer.o_proj.shape == (576, 576)
    assert layer.gate_up.shape == (2 * 1536, 576) and layer.down.shape == (576, 1536)
    assert layer.qkv.bias is None
    assert torch.isfinite(model.embed(torch.arange(0, 49152, 97))).all()


def test_q_and_k_rows_are_unpermuted_from_the_file(default_gguf):
    from gguf import quants
    cfg = config_from_gguf(default_gguf.metadata, default_gguf.tensors.keys())
    for name, heads in (("blk.3.attn_q.weight", cfg.num_heads), ("blk.3.attn_k.weight", cfg.num_kv_heads)):
        info = default_gguf.tensors[name]
        raw = quants.dequantize(np.asarray(info.data), info.qtype).reshape(info.shape)
        ours = dequantize_tensor(default_gguf, name, cfg)
        np.testing.assert_array_equal(llama_cpp_permute(ours, heads), raw)
    v = default_gguf.tensors["blk.3.attn_v.weight"]
    np.testing.assert_array_equal(dequantize_tensor(default_gguf, v.name, cfg),
                                  quants.dequantize(np.asarray(v.data), v.qtype).reshape(v.shape))


def test_rope_scaling_and_arch_metadata():
    meta = {"general.architecture": "llama", "llama.embedding_length": 64,
            "llama.attention.head_count": 4, "llama.feed_forward_length": 128, "llama.block_count": 2,
            "llama.vocab_size": 100, "llama.rope.scaling.type": "linear",
            "llama.rope.scaling.factor": 4.0}
    cfg = config_from_gguf(meta, ["output.weight"])
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    assert cfg.num_kv_heads == 4 and cfg.head_dim == 16 and not cfg.tie_word_embeddings
    with pytest.raises(NotImplementedError, match="gemma"):
        config_from_gguf({**meta, "general.architecture": "gemma"})


def test_not_a_gguf_file_is_rejected(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF"):
        GGUFFile(bad)


RESIDENT_AFTER_LOAD = """
import sys, torch
from radixgate.runtime.model.loader import default_model_path, load_model
path = str(default_model_path().resolve())
loaded = load_model(path)
total, current = 0, None
for line in open("/proc/self/smaps"):
    fields = line.split()
    if "-" in fields[0] and len(fields) >= 5:
        current = fields[5] if len(fields) >= 6 else None
    elif fields[0] == "Rss:" and current == path:
        total += int(fields[1]) * 1024
embedded = float(loaded.model.embed(torch.tensor(loaded.tokenizer.encode("Hello there"))).abs().sum())
print(total, embedded)
"""


def test_a_built_model_leaves_its_gguf_file_out_of_the_resident_set():
    """In a fresh process: of the ~98 MB file, ~94 MB stayed resident after the build."""
    from radixgate.runtime.model.loader import default_model_path
    out = subprocess.run([sys.executable, "-c", RESIDENT_AFTER_LOAD], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    resident, embedded = out.stdout.split()
    assert int(resident) < 0.1 * default_model_path().stat().st_size, resident
    assert float(embedded) > 0                           # rows still read from the file
