"""The model side of the runtime: what a checkpoint is and how one forward pass runs.

It owns the model's config (model_config.py), reading checkpoints (loader.py picks a format:
loader_gguf.py with gguf_file.py and gguf_quants.py, loader_hf.py, or tiny.py's random
weights, built on a thread of its own: fresh_thread.py), the tokenizer (tokenizer.py,
tokenizer_gguf.py; tokenizer_spm.py: SentencePiece files), the layers (weights.py, linear.py, head.py, rope.py, model.py; the Llama relatives'
features: docs/ARCHITECTURE.md section 9), the
paged KV cache (kv_cache.py; kv_dtypes.py: the torch dtype of each kv.dtypes
name), a step's batch (batch.py) and the memory planner's arithmetic (planner.py). It imports nothing of runtime.engine
(tests/test_import_graph.py): a model knows nothing of requests, scheduling or tiers.
"""
