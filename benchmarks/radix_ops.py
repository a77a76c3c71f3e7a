"""Radix tree operation costs vs a hash-block prefix cache, measured side by side.

    python -m benchmarks.radix_ops [--quick|--full]

Builds a tree of >= 100k cached tokens in thousands of nodes (shared system prompts per
tenant, multi-turn conversations that fork, a few long agent sessions), then times:
- match + insert of 8,192-token prompts whose first ~7k tokens are cached (the engine's
  per-request flow: match, allocate outside the timer, insert);
- the same for fully cached 8,192-token prompts;
- an insert that splits a node inside a block;
- evicting 1,000 tokens (63 blocks) from the full tree;
and, on the same prompts, what a hash-block cache does per request (vLLM style: chained
SHA-256 over pickled 16-token blocks, dict lookups until the first miss, registration of
the new blocks), plus a cheaper raw-bytes SHA-256 chain. Prints a markdown table and writes
radix_ops.json into ``--out`` (default benchmarks/out).
"""

from __future__ import annotations

import hashlib
import pickle
import random
import statistics
import time
from array import array
from pathlib import Path

from radixgate.kv import BlockPool, RadixTree, token_array

from benchmarks.cli import size_parser, write_result

B = 16
VOCAB = 49152
PROMPT_LEN = 8192
HASH_BLOCK = 16
OUT_DIR = Path(__file__).parent / "out"


# ---- building a realistic tree ---------------------------------------------------------

class Caller:
    """The engine's side of the contract: match, copy-on-write, allocate, insert, release."""

    def __init__(self, tree: RadixTree, pool: BlockPool):
        self.tree, self.pool = tree, pool

    def match(self, namespace, tokens):
        return self.tree.match(namespace, tokens)

    def blocks_after(self, match, n_tokens):
        """The request's block table: matched full blocks + a private copy of a partial one
        + fresh blocks for the rest (allocation is outside every timer)."""
        keep = match.length // B
        self.pool.decref_many(match.blocks[keep:])    # the partial block: copied, not shared
        need = -(-n_tokens // B) - keep
        if need > self.pool.num_free():
            self.tree.evict(need - self.pool.num_free())
        return match.blocks[:keep] + self.pool.allocate(need)

    def release(self, match, table):
        """Unlock and drop the request's references (its table holds the matched ones)."""
        self.tree.unlock(match.handle)
        self.pool.decref_many(table)

    def serve(self, namespace, tokens):
        match = self.match(namespace, tokens)
        table = self.blocks_after(match, len(tokens))
        self.tree.insert(namespace, tokens, table)
        self.release(match, table)


def fresh(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def build_tree(rng: random.Random, caller: Caller, tenants=4, systems=4, conversations=120,
               sessions=6) -> dict:
    """Returns the long session paths (namespace, tokens) the 8k prompts extend."""
    long_paths = []
    for t in range(tenants):
        ns = f"tenant-{t}"
        system_prompts = [fresh(rng, rng.randint(800, 2500)) for _ in range(systems)]
        histories = []
        for _ in range(conversations):
            if histories and rng.random() < 0.3:         # edit / regenerate: fork a history
                base = rng.choice(histories)
                tokens = base[: rng.randint(len(base) // 2, len(base))]
            else:
                tokens = list(rng.choice(system_prompts))
            for _ in range(rng.randint(1, 4)):
                tokens += fresh(rng, rng.randint(40, 300))   # user turn -> prompt inserted
                caller.serve(ns, tokens)
                tokens += fresh(rng, rng.randint(40, 300))   # reply -> prompt + output inserted
                caller.serve(ns, tokens)
            histories.append(tokens)
        for _ in range(sessions // tenants + 1):            # long agent sessions
            tokens = list(rng.choice(system_prompts))
            while len(tokens) < 7400:
                tokens += fresh(rng, rng.randint(200, 700))
                caller.serve(ns, tokens)
            long_paths.append((ns, tokens[:7000]))
    return {"long_paths": long_paths}


# ---- the hash-block baseline -----------------------------------------------------------

def chained_hashes_vllm(tokens: list[int]) -> list[bytes]:
    """vLLM-style per-request block hashes: sha256(pickle((parent, block tokens, extra)))."""
    parent = b"\x00" * 32
    hashes = []
    for i in range(0, len(tokens) - HASH_BLOCK + 1, HASH_BLOCK):
        payload = pickle.dumps((parent, tuple(tokens[i:i + HASH_BLOCK]), None),
                               protocol=pickle.HIGHEST_PROTOCOL)
        parent = hashlib.sha256(payload).digest()
        hashes.append(parent)
    return hashes


def chained_hashes_raw(tokens: list[int]) -> list[bytes]:
    """Cheapest chained form: sha256(parent digest + packed int32 tokens)."""
    data = array("i", tokens).tobytes()
    step = HASH_BLOCK * 4
    parent = b"\x00" * 32
    hashes = []
    for i in range(0, len(data) - step + 1, step):
        parent = hashlib.sha256(parent + data[i:i + step]).digest()
        hashes.append(parent)
    return hashes


HASHES = {"hash_vllm": chained_hashes_vllm, "hash_raw": chained_hashes_raw}


def hash_cache_request(hash_fn, tokens, table: dict) -> int:
    """Per request: hash every full block, look up until the first miss, register the rest."""
    hashes = hash_fn(tokens)
    hit = 0
    for h in hashes:
        if h not in table:
            break
        hit += 1
    for h in hashes[hit:]:
        table[h] = len(table)
    return hit * HASH_BLOCK


# ---- timing ------------------------------------------------------------------------------

def summary_us(samples_ns: list[int]) -> dict:
    """Median, mean and minimum in µs (the minimum is the least disturbed by other load)."""
    return {"median_us": round(statistics.median(samples_ns) / 1e3, 2),
            "mean_us": round(statistics.fmean(samples_ns) / 1e3, 2),
            "min_us": round(min(samples_ns) / 1e3, 2), "n": len(samples_ns)}


def time_side_by_side(caller: Caller, prompts, warm_prompts, as_array: bool) -> dict:
    """Per prompt, the radix flow (match, allocate untimed, insert, release) and then both
    hash caches on the same tokens, interleaved so machine load hits all of them alike.

    ``as_array``: the request converts its token list once with ``token_array`` (timed, in
    ``match``) and passes the array to match and insert; otherwise both get the list.
    """
    tables = {name: {} for name in HASHES}
    for name, fn in HASHES.items():                 # the cached prefixes are known to the caches
        for _, tokens in warm_prompts:
            hash_cache_request(fn, tokens, tables[name])
    samples = {key: [] for key in ("match", "insert", "match_plus_insert", "release", *HASHES)}
    hits = {key: [] for key in ("radix", *HASHES)}
    clock = time.perf_counter_ns
    for ns, tokens in prompts:
        t0 = clock()
        query = token_array(tokens) if as_array else tokens
        match = caller.match(ns, query)
        t1 = clock()
        table = caller.blocks_after(match, len(tokens))
        t2 = clock()
        caller.tree.insert(ns, query, table)
        t3 = clock()
        caller.release(match, table)
        t4 = clock()
        samples["match"].append(t1 - t0)
        samples["insert"].append(t3 - t2)
        samples["match_plus_insert"].append(t1 - t0 + t3 - t2)
        samples["release"].append(t4 - t3)
        hits["radix"].append(match.length)
        for name, fn in HASHES.items():
            t0 = clock()
            hits[name].append(hash_cache_request(fn, tokens, tables[name]))
            samples[name].append(clock() - t0)
    out = {key: summary_us(values) for key, values in samples.items()}
    out["mean_hit_tokens"] = {key: round(statistics.fmean(values)) for key, values in hits.items()}
    for name in HASHES:
        per_prompt = [r / h for r, h in zip(samples["match_plus_insert"], samples[name])]
        out[f"ratio_vs_{name}"] = round(statistics.median(per_prompt), 3)
        out[f"min_ratio_vs_{name}"] = round(min(samples["match_plus_insert"]) / min(samples[name]), 3)
    return out


def split_inserts(rng, caller: Caller, count: int) -> dict:
    """Inserts that diverge inside an existing node, at a position inside a block."""
    nodes = [n for ns in caller.tree.namespaces for n in _nodes(ns.root) if n.num_tokens >= 48]
    samples = []
    for node in rng.sample(nodes, min(count, len(nodes))):
        at = node.start + rng.randint(1, node.num_tokens - 2)
        if at % B == 0:
            at += 1
        path = list(node.path_tokens())
        tokens = path[:at] + [VOCAB + 1]               # a token no path holds
        match = caller.match(node.ns.name, tokens)
        table = caller.blocks_after(match, len(tokens))
        t0 = time.perf_counter_ns()
        caller.tree.insert(node.ns.name, tokens, table)
        samples.append(time.perf_counter_ns() - t0)
        caller.release(match, table)
    return summary_us(samples)


def _nodes(root):
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def time_evictions(tree: RadixTree, reps: int, tokens: int = 1000) -> dict:
    blocks = -(-tokens // B)
    samples, freed = [], []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        freed.append(tree.evict(blocks))
        samples.append(time.perf_counter_ns() - t0)
    return {**summary_us(samples), "blocks_asked": blocks, "mean_blocks_freed": statistics.fmean(freed)}


# ---- main --------------------------------------------------------------------------------

def run(quick: bool) -> dict:
    rng = random.Random(1234)
    pool = BlockPool(100_000, B)
    tree = RadixTree(pool)
    caller = Caller(tree, pool)
    started = time.perf_counter()
    built = build_tree(rng, caller)
    tree.check_integrity()
    build_s = time.perf_counter() - started
    before = tree.stats()
    reps = 100 if quick else 400

    results = {"tree": {"nodes": before.nodes, "cached_tokens": before.cached_tokens,
                        "namespaces": len(before.namespaces), "build_s": round(build_s, 2)}}
    for flow, as_array in (("list", False), ("array", True)):
        partial = [(ns, path + fresh(rng, PROMPT_LEN - len(path)))
                   for ns, path in (rng.choice(built["long_paths"]) for _ in range(reps))]
        results[f"partial_{flow}"] = time_side_by_side(caller, partial, built["long_paths"], as_array)
        cached = partial[: reps // 2]                # now fully cached: a repeat of each prompt
        results[f"cached_{flow}"] = time_side_by_side(caller, cached, cached, as_array)
    results["split_insert"] = split_inserts(rng, caller, reps)
    results["evict_1000_tokens"] = time_evictions(tree, reps)
    after = tree.stats()
    results["tree"].update(nodes_after=after.nodes, cached_tokens_after=after.cached_tokens)
    tree.check_integrity()
    return results


def table(r: dict) -> str:
    mi = "match_plus_insert"
    rows = [("tree", f"{r['tree']['nodes']} nodes, {r['tree']['cached_tokens']} cached tokens, "
                     f"{r['tree']['namespaces']} namespaces", "", "")]
    for flow in ("list", "array"):
        for case, label in (("partial", "~7k of 8k cached"), ("cached", "8k fully cached")):
            x = r[f"{case}_{flow}"]
            rows.append((f"{label}, tokens as {flow}: radix match / insert",
                         f"{x['match']['median_us']} / {x['insert']['median_us']}",
                         f"{x['match']['min_us']} / {x['insert']['min_us']}", ""))
            rows.append((f"{label}, tokens as {flow}: radix match+insert", x[mi]["median_us"], x[mi]["min_us"],
                         f"{x['ratio_vs_hash_vllm']}x vLLM-style hash, {x['ratio_vs_hash_raw']}x raw hash "
                         f"(ratio of minima: {x['min_ratio_vs_hash_vllm']}x, {x['min_ratio_vs_hash_raw']}x)"))
            rows.append((f"{label}: hash cache, vLLM-style (sha256 of pickled blocks)",
                         x["hash_vllm"]["median_us"], x["hash_vllm"]["min_us"], "1.0x"))
            rows.append((f"{label}: hash cache, raw sha256 chain", x["hash_raw"]["median_us"],
                         x["hash_raw"]["min_us"], ""))
    rows.append(("insert splitting a node inside a block", r["split_insert"]["median_us"],
                 r["split_insert"]["min_us"], ""))
    ev = r["evict_1000_tokens"]
    rows.append(("evict 1,000 tokens (63 blocks) from the full tree", ev["median_us"], ev["min_us"],
                 f"{ev['mean_blocks_freed']:.0f} blocks freed per call"))
    lines = ["| operation | median µs | min µs | note |", "|---|---|---|---|"]
    lines += [f"| {name} | {median} | {low} | {note} |" for name, median, low, note in rows]
    lines.append("\nratios: median over prompts of (radix match+insert) / (hash cache request), each "
                 "pair timed back to back; minima: fastest radix run / fastest hash run")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = size_parser(__doc__, quick="fewer repetitions", full="more repetitions",
                       out=OUT_DIR).parse_args(argv)
    results = run(quick=args.quick)
    print(table(results))
    print(f"\nwritten {write_result(args.out, 'radix_ops.json', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
