"""KV capacity planner: the reference figures and the CLI table."""
import pytest

from radixgate.gateway.cli import main as radixgate_main
from radixgate.runtime.model.planner import GiB, KiB, PRESETS, format_plan_table, plan

GB = 10**9


def test_llama_2_7b_is_512_kib_per_token_and_4_gib_per_8k():
    p = plan("llama-2-7b", memory_gb=80, context_tokens=8192)
    assert p.bytes_per_token == 512 * KiB
    assert p.bytes_per_conversation == 4 * GiB
    assert p.max_tokens == 80 * GiB // (512 * KiB) == 163_840 and p.max_conversations == 20


def test_llama_3_8b_is_128_kib_per_token_and_1_gib_per_8k():
    p = plan("llama-3-8b", memory_gb=80, context_tokens=8192)
    assert p.bytes_per_token == 128 * KiB and p.bytes_per_conversation == 1 * GiB
    assert p.max_conversations == 80


def test_fifty_conversations_of_8000_tokens_on_llama_2_7b_need_about_200_gb():
    needed = plan("llama-2-7b", memory_gb=80, context_tokens=8000).memory_for(50)
    assert needed == 50 * 8000 * 512 * KiB
    assert 195 * GiB < needed < 210 * GB          # 209.7 GB = 195.3 GiB: "~200 GB"


def test_gqa_presets_and_dtype_bytes_scale_linearly():
    assert plan("llama-2-70b", 1, 1).bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert plan("mistral-7b", 1, 1).bytes_per_token == plan("llama-3-8b", 1, 1).bytes_per_token
    assert plan("qwen2-7b", 1, 1).bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert plan("llama-2-7b", 1, 1, dtype_bytes=1).bytes_per_token == 256 * KiB
    assert {"llama-2-7b", "llama-3-8b", "llama-2-70b", "llama-3-70b", "mistral-7b", "qwen2-7b",
            "smollm2-135m"} <= set(PRESETS)


def test_loaded_config_and_default_file_match_the_smollm2_preset(tiny_model):
    assert plan("default", 1, 8192).bytes_per_token == PRESETS["smollm2-135m"].kv_bytes_per_token(2)
    assert plan(tiny_model.config, 1, 100).bytes_per_token == tiny_model.config.kv_bytes_per_token(2)


def test_unknown_model_name_is_an_error():
    with pytest.raises(ValueError, match="not a preset"):
        plan("gpt-17", 1, 1)
    assert radixgate_main(["plan", "gpt-17"]) == 2


def test_table_lists_each_model_with_its_figures(capsys):
    table = format_plan_table([plan("llama-2-7b", 80, 8000), plan("llama-3-8b", 80, 8000)], conversations=50)
    lines = table.splitlines()
    assert len(lines) == 4 and lines[2].startswith("llama-2-7b") and "512 KiB" in lines[2]
    assert "195.3 GiB" in lines[2] and "128 KiB" in lines[3]
    assert radixgate_main(["plan", "llama-2-7b", "--memory-gb", "4", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "4 GiB" in out and "8,192" in out


def test_kv_dtype_rows_count_the_8_bit_scales(capsys):
    assert plan("smollm2-135m", 1, 1, kv_dtype="bfloat16").bytes_per_token == 2 * 30 * 3 * 64 * 2
    eight_bit = plan("smollm2-135m", 4, 8192, kv_dtype="fp8")
    assert eight_bit.bytes_per_token == 2 * 30 * 3 * (64 + 2) and eight_bit.kv_dtype == "fp8"
    assert eight_bit.max_tokens >= 3.5 * plan("smollm2-135m", 4, 8192, kv_dtype="float32").max_tokens
    assert radixgate_main(["plan", "smollm2-135m", "--memory-gb", "4", "--kv-dtype", "all"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split()[1] for r in rows] == ["(float32)", "(bfloat16)", "(float16)", "(int8)", "(fp8)"]


GEMMA_3_1B = dict(hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=256)


@pytest.mark.parametrize("config_cls, fields, preset", [
    ("Gemma2Config", {}, "gemma-2-2b"), ("Gemma3TextConfig", GEMMA_3_1B, "gemma-3-1b"),
    ("Phi3Config", {}, "phi-3-mini")])
def test_the_relatives_presets_match_their_configs(tmp_path, config_cls, fields, preset):
    """transformers' configs of these models (the defaults are Gemma 2 2B and Phi-3 mini): a
    folder holding only config.json plans (window layers counted in full) as the preset."""
    transformers = pytest.importorskip("transformers")
    getattr(transformers, config_cls)(**fields).save_pretrained(tmp_path)
    ours = plan(str(tmp_path), 1, 4096)
    assert ours.bytes_per_token == PRESETS[preset].kv_bytes_per_token(2)
    assert ours.name == tmp_path.name


def test_window_layers_plan_a_pool_of_their_own(capsys):
    """Gemma 3 4B at 32k tokens: its 29 window layers keep W + a block per conversation in a
    pool of their own (auto: half as many blocks as the main pool), so about twice the
    tokens fit as with every layer counted in full; a window as long as the context, or a
    ratio of 1, plans one pool."""
    pooled = plan("gemma-3-4b", 16, 32768)
    whole = plan("gemma-3-4b", 16, 32768, window_ratio=1.0)
    assert pooled.window == 1024 and pooled.window_layers == 29 and not whole.window
    assert pooled.bytes_per_token + pooled.window_bytes_per_token == whole.bytes_per_token
    assert pooled.max_tokens > 1.7 * whole.max_tokens
    assert pooled.max_conversations >= 2 * whole.max_conversations
    assert pooled.held_per_conversation(32768) == (32768 * pooled.bytes_per_token
                                                   + (1024 + 16) * pooled.window_bytes_per_token)
    used = pooled.max_tokens * pooled.bytes_per_token + \
        pooled.window_tokens * pooled.window_bytes_per_token
    assert used <= pooled.memory_bytes
    lean = plan("gemma-3-4b", 16, 32768, window_ratio=0.1)
    assert lean.max_tokens > 3 * whole.max_tokens
    assert not plan("gemma-2-2b", 16, 4096).window                 # W = 4,096: no pool
    assert radixgate_main(["plan", "gemma-3-4b", "--context", "32768", "--window-ratio",
                           "0.1"]) == 0
    assert "W=1,024 x29" in capsys.readouterr().out


def test_a_gemma_3_folder_plans_as_its_preset(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.Gemma3TextConfig(hidden_size=2560, num_hidden_layers=34, num_attention_heads=8,
                                  num_key_value_heads=4, head_dim=256,
                                  sliding_window=1024).save_pretrained(tmp_path)
    ours, preset = plan(str(tmp_path), 16, 32768), plan("gemma-3-4b", 16, 32768)
    assert (ours.max_tokens, ours.window_tokens, ours.window_layers) == (
        preset.max_tokens, preset.window_tokens, preset.window_layers)
