"""The engine side of the runtime: requests in, tokens out, over one loaded model.

It owns the request API (api.py), the engine thread and its handle (engine.py, core.py,
handle.py), scheduling and KV blocks (scheduler.py, block_manager.py, sequence.py,
pin_shares.py, engine_config.py), sampling, speculative drafts (spec.py) and what ends a request (sampling.py, stop.py,
grammar.py and grammar_masks.py for constrained output, submit_checks.py), output and
accounting (output.py, detokenize.py, snapshot.py, trace.py), KV events (kv_events.py) and the
engine thread's CPU use (cpu_threads.py). It builds on runtime.model and runtime.kv_tier.
"""
