"""The engine side of the runtime: requests in, tokens out, over one loaded model.

It owns the request API (api.py), the engine thread and its handle (engine.py, core.py,
handle.py), scheduling (scheduler.py, sequence.py, pin_shares.py, engine_config.py), sampling, speculative drafts (spec.py) and what ends a request (sampling.py, stop.py,
grammar.py and grammar_masks.py for constrained output, submit_checks.py), output and
accounting (output.py, detokenize.py, snapshot.py, trace.py) and the engine thread's CPU use
(cpu_threads.py). It builds on runtime.model and on radixgate.kv, which keeps the books of KV
blocks (the manager, the tree, the window pool, the disk tier, KV events).
"""
