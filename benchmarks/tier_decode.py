"""Single-stream decode with the disk tier on against off, side by side in one run, as
``make serve`` runs it: the default model over HTTP, streamed greedy answers.

Each server (a fresh process, the same KV budget) first takes the traffic that makes a tier
work: two long prompts that evict each other through a small memory, and the first again
(spilled by the writer thread, loaded back by the loader thread; the tier-off server
recomputes). Then ``runs`` 200-token answers to a short prompt, one at a time. Servers are
interleaved (off, on, on, off, ...) so a drift of the machine's speed hits both; the figure
is the ratio of median decode tok/s, tier on / tier off, per repetition. Each server's
thread switches (the governor's: one torch thread while other processes keep a core busy)
are listed beside its figures: a run with a switch measured the machine's load, not the
tier.

Run: ``python -m benchmarks.kv_tier_bench`` (section "decode"), or alone with
``python -m benchmarks.tier_decode`` (``--quick``: one repetition of 2 runs).
"""
from __future__ import annotations

import asyncio
import json
import statistics
import tempfile

import aiohttp

from benchmarks.cli import size_parser, write_result
from benchmarks.launch import ADMIN_KEY, ServerProcess, bench_spec, tenant_key
from benchmarks.peer_speed import complete

KV_CACHE_GB = 0.25          # about 5,700 tokens of the default model's float32 KV
DISK_GB = 4.0               # make serve's KV_DISK_GB
LONG_TOKENS = 3000          # two of them do not fit together: each evicts the other
ANSWER_TOKENS = 200


def prompts(vocab: int = 49000) -> dict[str, list[int]]:
    def fresh(seed: int, n: int) -> list[int]:
        return [(k * 7919 + seed * 104729) % (vocab - 200) + 100 for k in range(n)]
    return {"long_a": fresh(1, LONG_TOKENS), "long_b": fresh(2, LONG_TOKENS),
            "short": fresh(3, 24)}


async def measure(base_url: str, runs: int) -> dict:
    texts = prompts()
    headers = {"x-api-key": tenant_key("default")}
    async with aiohttp.ClientSession(headers=headers) as session:
        for name in ("long_a", "long_b", "long_a"):          # spill, then load (tier on)
            warm = await complete(session, base_url, texts[name], 2)
        rates = [(await complete(session, base_url, texts["short"], ANSWER_TOKENS)).decode_tok_s
                 for _ in range(runs)]
        async with session.get(base_url + "/v1/cache/stats",
                               headers={"x-api-key": ADMIN_KEY}) as resp:
            stats = await resp.json()
    disk = (stats.get("tiers") or {}).get("disk") or {}
    return {"decode_tok_s": [round(r, 1) for r in rates],
            "median_tok_s": round(statistics.median(rates), 1),
            "long_prompt_cached_tokens": warm.cached_tokens,
            "disk_writes": disk.get("writes"), "disk_loads": disk.get("loads")}


def run_server(tier: bool, runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="radixgate-tier-") as folder:
        extra = ("--kv-disk-dir", folder, "--kv-disk-gb", str(DISK_GB)) if tier else ()
        server = ServerProcess(bench_spec(extra, kv_cache_gb=KV_CACHE_GB)).start()
        try:
            figures = asyncio.run(measure(server.base_url, runs))
        finally:
            server.stop()
        log = (server.workdir / "server.log").read_text(errors="replace")
        figures["thread_switches"] = [line.split("radixgate.runtime.", 1)[-1] for line in
                                      log.splitlines() if "engine torch threads" in line]
        return figures


def run(quick: bool = False) -> dict:
    repetitions, runs = (1, 2) if quick else (2, 3)
    reps = []
    for rep in range(repetitions):
        order = ("off", "on") if rep % 2 == 0 else ("on", "off")
        got = {name: run_server(name == "on", runs) for name in order}
        ratio = got["on"]["median_tok_s"] / got["off"]["median_tok_s"]
        reps.append({"tier_off": got["off"], "tier_on": got["on"], "ratio": round(ratio, 3)})
        print(f"  repetition {rep + 1}: tier on {got['on']['median_tok_s']} / off "
              f"{got['off']['median_tok_s']} tok/s = {ratio:.3f}x", flush=True)
    return {"answer_tokens": ANSWER_TOKENS, "kv_cache_gb": KV_CACHE_GB,
            "ratios": [r["ratio"] for r in reps], "repetitions": reps}


def main(argv: list[str] | None = None) -> None:
    args = size_parser(__doc__, quick="one repetition of 2 runs",
                       full="two repetitions of 3 runs").parse_args(argv)
    result = run(args.quick)
    write_result(args.out, "tier_decode.json", result, indent=1)
    print(json.dumps({"ratios": result["ratios"]}))


if __name__ == "__main__":
    main()
