"""Model forward speed on this machine (no engine): ``python -m benchmarks.forward_speed``.

Load time; prefill of N tokens (one sequence) in tokens/s; decode steps (1 and 16 sequences)
in tokens/s; with ``--vs-transformers`` the same prefill and single-sequence decode through
transformers' model loaded from the same GGUF (fp32), measured in the same run.

``--dtypes float32,bfloat16,int8,int4`` measures each weights dtype (radixgate/runtime/model/linear.py) side by
side: ``--rounds`` rounds of one child process per dtype, interleaved, then the medians of load
time, prefill, decode at 1 and 16 sequences, the matmul weights' bytes and peak RSS, and the
ratios to the first dtype (on a shared machine single runs are not to be trusted).

``--modes default,deterministic`` measures the default mode against the deterministic one
(docs/ARCHITECTURE.md section 5c) in one process on one loaded model, interleaved for
``--rounds`` rounds: medians and the deterministic / default ratios.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from radixgate.runtime.model.batch import build_forward_batch
from radixgate.runtime.model.kv_cache import KVCache
from radixgate.runtime.model.loader import default_model_path, load_model

BLOCK = 16


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def ours(prefill_len: int, decode_steps: int, repeat: int, weights_dtype: str = "auto") -> dict:
    start = time.perf_counter()
    loaded = load_model(weights_dtype=weights_dtype)
    load_s = time.perf_counter() - start
    return {"load_s": load_s, **measure(loaded, prefill_len, decode_steps, repeat)}


def measure(loaded, prefill_len: int, decode_steps: int, repeat: int,
            deterministic: bool = False) -> dict:
    """Prefill and decode (1 and 16 sequences) of one loaded model, in one mode."""
    model, cfg = loaded.model, loaded.config
    ids = (loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog. ") * 400)[:prefill_len]
    blocks = -(-(prefill_len + decode_steps) // BLOCK)
    kv = KVCache(cfg.num_layers, blocks + 16 * 10, BLOCK, cfg.num_kv_heads, cfg.head_dim)
    table = list(range(blocks))
    prefill = _best(lambda: model.forward(build_forward_batch(
        [ids], [0], [table], BLOCK, deterministic=deterministic), kv), repeat)

    def decode(n_seqs: int, start_pos: int, tables) -> float:
        t0 = time.perf_counter()
        for step in range(decode_steps):
            model.forward(build_forward_batch([[ids[step]]] * n_seqs, [start_pos + step] * n_seqs,
                                              tables, BLOCK, deterministic=deterministic), kv)
        return n_seqs * decode_steps / (time.perf_counter() - t0)

    single = decode(1, prefill_len, [table])
    short = 128                                   # 16 sequences with 128 cached tokens each
    tables16 = [list(range(blocks + i * 10, blocks + i * 10 + 10)) for i in range(16)]
    model.forward(build_forward_batch([ids[:short]] * 16, [0] * 16, tables16, BLOCK,
                                      deterministic=deterministic), kv)
    batch16 = decode(16, short, tables16)
    return {"prefill_tok_s": prefill_len / prefill, "decode1_tok_s": single,
            "decode16_tok_s": batch16, "weights_mb": model.weight_bytes() / 1e6,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "weights_dtype": loaded.weights_dtype}


def transformers_side(prefill_len: int, decode_steps: int, repeat: int) -> dict:
    from transformers import AutoModelForCausalLM
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32).eval()
    ids = torch.arange(1000, 1000 + prefill_len)[None]
    with torch.inference_mode():
        prefill = _best(lambda: model(ids, use_cache=True), repeat)
        out = model(ids, use_cache=True)
        past, token = out.past_key_values, ids[:, -1:]
        t0 = time.perf_counter()
        for _ in range(decode_steps):
            past = model(token, past_key_values=past, use_cache=True).past_key_values
        decode = decode_steps / (time.perf_counter() - t0)
    return {"prefill_tok_s": prefill_len / prefill, "decode1_tok_s": decode}


def compare_dtypes(dtypes: list[str], rounds: int, args) -> None:
    """Interleaved child runs, one per dtype per round; print medians and ratios to the first."""
    runs: dict[str, list[dict]] = {d: [] for d in dtypes}
    for _ in range(rounds):
        for dtype in dtypes:
            cmd = [sys.executable, "-m", "benchmarks.forward_speed", "--json", "--prefill",
                   str(args.prefill), "--decode-steps", str(args.decode_steps), "--repeat",
                   str(args.repeat), "--weights-dtype", dtype] + \
                (["--threads", str(args.threads)] if args.threads else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[dtype].append(json.loads(out.strip().splitlines()[-1]))
            print(dtype, runs[dtype][-1], flush=True)
    keys = ("load_s", "prefill_tok_s", "decode1_tok_s", "decode16_tok_s", "weights_mb", "peak_rss_mb")
    median = {d: {k: statistics.median(r[k] for r in rs) for k in keys} for d, rs in runs.items()}
    base = dtypes[0]
    print("| weights | " + " | ".join(keys) + " |\n" + "|---" * (len(keys) + 1) + "|")
    for d in dtypes:
        cells = [f"{median[d][k]:.1f} ({median[d][k] / median[base][k]:.2f}x)" for k in keys]
        print(f"| {d} | " + " | ".join(cells) + " |")


def compare_modes(modes: list[str], rounds: int, args) -> dict:
    """Both modes on one loaded model, interleaved (A B, B A, ...): medians and ratios to
    the first mode."""
    loaded = load_model(weights_dtype=args.weights_dtype)
    keys = ("prefill_tok_s", "decode1_tok_s", "decode16_tok_s")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for round_ in range(rounds):
        for mode in (modes if round_ % 2 == 0 else modes[::-1]):
            runs[mode].append(measure(loaded, args.prefill, args.decode_steps, args.repeat,
                                      deterministic=mode == "deterministic"))
            print(mode, {k: round(runs[mode][-1][k], 1) for k in keys}, flush=True)
    median = {m: {k: statistics.median(r[k] for r in rs) for k in keys} for m, rs in runs.items()}
    print("| mode | " + " | ".join(keys) + " |\n" + "|---" * (len(keys) + 1) + "|")
    for m in modes:
        cells = [f"{median[m][k]:.1f} ({median[m][k] / median[modes[0]][k]:.3f}x)" for k in keys]
        print(f"| {m} | " + " | ".join(cells) + " |")
    return median


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--vs-transformers", action="store_true")
    parser.add_argument("--weights-dtype", default="auto",
                        choices=["auto", "float32", "bfloat16", "int8", "int4"])
    parser.add_argument("--dtypes", default=None, metavar="A,B,...",
                        help="compare these weights dtypes side by side (child processes)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds for --dtypes")
    parser.add_argument("--json", action="store_true", help="print only a JSON line of ours")
    parser.add_argument("--modes", default=None, metavar="default,deterministic",
                        help="compare the default and deterministic modes (one process)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.modes:
        return compare_modes(args.modes.split(","), args.rounds, args)
    if args.dtypes:
        return compare_dtypes(args.dtypes.split(","), args.rounds, args)
    result = ours(args.prefill, args.decode_steps, args.repeat, args.weights_dtype)
    if args.json:
        print(json.dumps(result))
        return
    print(f"torch threads: {torch.get_num_threads()}")
    print("radixgate:", {k: v if isinstance(v, str) else round(v, 2) for k, v in result.items()})
    if args.vs_transformers:
        ref = transformers_side(args.prefill, args.decode_steps, args.repeat)
        print("transformers:", {k: round(v, 2) for k, v in ref.items()})
        for key in ref:
            print(f"{key}: radixgate / transformers = {result[key] / ref[key]:.2f}x")


if __name__ == "__main__":
    main()
