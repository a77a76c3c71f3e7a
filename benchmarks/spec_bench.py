"""Speculative decoding side by side: ``python -m benchmarks.spec_bench`` (about 6-8 min on
2 cores; ``--tiny``: the random tiny model, radixgate only, for the tests).

One run: one radixgate server (``--spec ngram``) measures every workload with drafts off
(the request's ``speculative: false``) and on, interleaved, ``--repeat`` times each (3), and
reports medians: on a shared host the same process alternating is the only fair pairing.
Then one llama-server process per mode, without speculation and with each of its n-gram
modes (``--spec-type ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``,
``ngram-cache``, their defaults otherwise), one pass each. All ``-t 2``, the default GGUF,
the same token ids over ``/v1/completions`` (greedy, fixed ``max_tokens``). Workloads:

- **code edit**: the prompt holds a ~1k-token Python file and asks for it back with one
  function renamed; the answer's share of tokens copied from the prompt (its 4-gram ending
  there occurs in the prompt) is reported with spec off;
- **tool call**: earlier tool results (JSON records) in the prompt, the answer a tool call
  whose arguments copy one of them;
- **agent turns**: a multi-turn agent conversation (a file the agent wrote, tool results,
  a summary) whose last answer re-emits the file with an edit and quotes a tool record;
- **control**: a short story sampled at temperature 0.8 (seed 1): nothing repeats (no
  4-gram of its answer occurs twice; greedy, this model loops on itself: 10% did);
- **16 streams**: 16 different short prompts at once, aggregate tokens / wall time.

Single-stream figures are decode tok/s (tokens after the first / time after the first).
Ratios: radixgate spec on / off, and radixgate spec on / llama-server's best n-gram mode
(per workload). Writes ``spec_bench[_tiny].json`` into ``--out``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.launch import ServerProcess, bench_spec, tenant_key
from benchmarks.peer_speed import THREADS, LlamaServer, together, complete
from benchmarks.peers import LLAMA_SERVER_BUILD_NOTE, peer_binary
from benchmarks.report import machine_info, save_report
from benchmarks.traces import default_gguf_path, load_tokenizer

OUT_DIR = Path(__file__).parent / "out"
LLAMA_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
WORKLOADS = ("code_edit", "tool_call", "agent_turns", "control")


@dataclass(frozen=True, slots=True)
class Sizes:
    functions: int = 16            # the file: ~1.1k tokens
    code_tokens: int = 256         # the edit's answer
    tool_records: int = 12
    tool_tokens: int = 96
    control_tokens: int = 128
    agent_tokens: int = 192        # the agent conversation's last answer
    streams: int = 16
    stream_tokens: int = 64
    context_tokens: int = 36864    # llama-server -c (-np 16: 2,304 a slot)


SIZES = {"default": Sizes(), "tiny": Sizes(functions=6, code_tokens=24, tool_records=3,
                                           tool_tokens=16, control_tokens=16, agent_tokens=16, streams=4,
                                           stream_tokens=8)}


def chat(tokenizer, user: str, answer_start: str = "") -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": user}])
    return tokenizer.encode(text + answer_start)


def python_file(n: int) -> str:
    parts = []
    for i in range(n):
        parts.append(f"def update_record_{i}(store, key, value):\n"
                     f"    \"\"\"Set field {i} of the record under key.\"\"\"\n"
                     f"    record = store.get(key, {{}})\n"
                     f"    record['field_{i}'] = value * {i + 2}\n"
                     f"    store[key] = record\n    return record\n")
    return "\n".join(parts)


def tool_results(n: int) -> str:
    rows = [{"id": f"cus_{4100 + i}", "name": f"Customer {i}", "city": ["Lisbon", "Oslo", "Osaka"][i % 3],
             "address": f"{12 + i} Harbour Street, Unit {i * 7}", "plan": "pro" if i % 2 else "basic"}
            for i in range(n)]
    return json.dumps(rows, indent=1)


def agent_conversation(tokenizer, sizes: Sizes) -> list[int]:
    """Earlier turns: the agent wrote a file, a tool returned records, the agent summarized;
    the last turn asks for the file again with an edit and one record quoted in a comment."""
    code = python_file(max(2, sizes.functions // 3))
    records = tool_results(max(2, sizes.tool_records // 2))
    turns = [{"role": "system", "content": "You are a coding agent. Answer with code only."},
             {"role": "user", "content": "Write helpers that set record fields."},
             {"role": "assistant", "content": "```python\n" + code + "\n```"},
             {"role": "user", "content": "Tool results from lookup_customers:\n" + records},
             {"role": "assistant", "content": "I have the customer records."},
             {"role": "user", "content": "Return the helpers file again, unchanged except "
              "update_record_1 renamed to set_record_1, and put the full JSON record of "
              "cus_4101 in a comment at the top."}]
    text = tokenizer.apply_chat_template(turns)
    return tokenizer.encode(text + "```python\n# ")


def make_prompts(tokenizer, sizes: Sizes) -> dict[str, list]:
    code = python_file(sizes.functions)
    edit = chat(tokenizer, "Here is a file:\n```python\n" + code + "\n```\nReturn the whole "
                "file unchanged, except rename update_record_3 to set_record_3.", "```python\n")
    tools = chat(tokenizer, "Tool results from lookup_customers:\n" + tool_results(sizes.tool_records)
                 + "\nCall ship_order with the full record of the customer in Osaka with the "
                 "lowest id, copying every field.", '{"name": "ship_order", "arguments": ')
    control = chat(tokenizer, "Write a short story about a lighthouse keeper who finds a "
                   "strange map. Use vivid, varied language.")
    topics = ["gardening", "volcanoes", "chess openings", "bread baking", "rivers", "robots",
              "jazz", "glaciers", "bees", "comets", "sailing", "tea", "bridges", "owls",
              "mosaics", "deserts"]
    streams = [chat(tokenizer, f"Tell me three surprising facts about {t}.")
               for t in (topics * 4)[:sizes.streams]]
    return {"code_edit": edit, "tool_call": tools, "agent_turns": agent_conversation(tokenizer, sizes),
            "control": control, "streams": streams}


def copied_share(prompt: list[int], answer: list[int], n: int = 4) -> float:
    """Share of answer tokens whose n-gram ending there (answer context included) occurs
    in the prompt."""
    grams = {tuple(prompt[i:i + n]) for i in range(len(prompt) - n + 1)}
    text = prompt[-(n - 1):] + answer
    hits = sum(tuple(text[i:i + n]) in grams for i in range(len(answer)))
    return hits / max(1, len(answer))


async def generate_text(session, base_url: str, prompt: list[int], max_tokens: int) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    async with session.post(base_url + "/v1/completions", json=body) as resp:
        answer = await resp.json()
    return answer["choices"][0]["text"]


async def measure(base_url: str, prompts: dict, sizes: Sizes, headers=None,
                  modes: tuple = ({},), repeat: int = 1, salted: bool = False) -> list[dict]:
    """Each workload in each of ``modes`` (extra body fields), interleaved (the order
    reversed every other pass), ``repeat`` passes; one dict of figures per mode, each
    figure the median of its passes. ``salted``: each pass and mode in a ``cache_salt`` of
    its own, so no pass drafts from what an earlier one said (the namespace's cached paths:
    with the deterministic default a seeded request says the same again, and the control
    ran 3.6x with drafts from its own earlier pass)."""
    lengths = {"code_edit": sizes.code_tokens, "tool_call": sizes.tool_tokens,
               "agent_turns": sizes.agent_tokens, "control": sizes.control_tokens}
    sampled = {"control": {"temperature": 0.8, "seed": 1}}
    seen: list[dict] = [{name: [] for name in (*WORKLOADS, "streams")} for _ in modes]
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=1800),
                                     connector=aiohttp.TCPConnector(force_close=True)) as session:
        await complete(session, base_url, prompts["control"][:8], 4)           # warm-up
        for rep in range(repeat):
            order = list(enumerate(modes)) if rep % 2 == 0 else list(enumerate(modes))[::-1]
            salt = (lambda index: {"cache_salt": f"pass-{rep}-mode-{index}"}) if salted \
                else (lambda index: {})
            for name in WORKLOADS:
                for index, extra in order:
                    reply = await complete(session, base_url, prompts[name], lengths[name],
                                           {**sampled.get(name, {}), **extra, **salt(index)})
                    seen[index][name].append(reply.decode_tok_s)
            for index, extra in order:
                replies, wall = await together(session, base_url, prompts["streams"],
                                                sizes.stream_tokens, {**extra, **salt(index)})
                seen[index]["streams"].append(sum(r.completion_tokens for r in replies) / wall)
    return [{name: {"tok_s": round(statistics.median(values), 2),
                    "passes": [round(v, 2) for v in values]}
             for name, values in figures.items()} for figures in seen]


async def _stats(base_url: str) -> dict:
    from benchmarks.launch import ADMIN_KEY
    async with aiohttp.ClientSession(headers={"x-api-key": ADMIN_KEY}) as session:
        async with session.get(base_url + "/v1/cache/stats") as resp:
            return (await resp.json()).get("spec", {})


def run_radixgate(prompts: dict, sizes: Sizes, tiny: bool, repeat: int) -> dict[str, dict]:
    """One ``--spec ngram`` server: drafts off (per request) and on, interleaved."""
    server = ServerProcess(bench_spec(("--threads", str(THREADS), "--spec", "ngram"),
                                      tiny=tiny, kv_cache_gb=0.5, max_model_len=4096)).start()
    try:
        off, on = asyncio.run(measure(server.base_url, prompts, sizes,
                                      {"x-api-key": tenant_key("default")},
                                      modes=({"speculative": False}, {}), repeat=repeat,
                                      salted=True))
        on["spec_counts"] = asyncio.run(_stats(server.base_url))
    finally:
        server.stop()
    return {"radixgate_none": off, "radixgate_ngram": on}


def run_llama(binary: Path, spec_type: str | None, prompts: dict, sizes: Sizes) -> dict:
    extra = ("--spec-type", spec_type) if spec_type else ()
    server = LlamaServer(binary, Path(default_gguf_path()), sizes.context_tokens,
                         extra_args=extra).start()
    try:
        return asyncio.run(measure(server.base_url, prompts, sizes))[0]
    finally:
        server.stop()


def answer_copy_share(prompts: dict, sizes: Sizes, tiny: bool, tokenizer) -> float:
    """The code edit's greedy answer (spec off, its text encoded again) and its share
    copied from the prompt."""
    server = ServerProcess(bench_spec(("--threads", str(THREADS)), tiny=tiny, kv_cache_gb=0.5,
                                      max_model_len=4096)).start()
    try:
        async def one():
            async with aiohttp.ClientSession(headers={"x-api-key": tenant_key("default")}) as s:
                return await generate_text(s, server.base_url, prompts["code_edit"],
                                           sizes.code_tokens)
        answer = tokenizer.encode(asyncio.run(one()))
    finally:
        server.stop()
    return round(copied_share(prompts["code_edit"], answer), 4)


def summarize(runs: dict[str, dict]) -> dict:
    """Per workload: spec on / off (the median of each pass's pair: the two ran next to each
    other), and spec on / llama-server's best n-gram mode (medians)."""
    summary = {}
    for name in (*WORKLOADS, "streams"):
        on_run, off_run = runs["radixgate_ngram"][name], runs["radixgate_none"][name]
        on, off = on_run["tok_s"], off_run["tok_s"]
        pairs = [a / b for a, b in zip(on_run.get("passes", [on]), off_run.get("passes", [off]))
                 if b]
        entry = {"spec_on_over_off": round(statistics.median(pairs), 3) if pairs else None}
        peers = {k: v[name]["tok_s"] for k, v in runs.items() if k.startswith("llama_ngram")}
        if peers:
            best = max(peers, key=peers.get)
            entry.update(llama_best=best, llama_best_tok_s=peers[best],
                         spec_on_over_llama_best=round(on / peers[best], 3))
        summary[name] = entry
    return summary


def run_benchmark(mode: str = "default", llama_binary: Path | None = None, log=print,
                  repeat: int = 3) -> dict:
    sizes, tiny = SIZES[mode], mode == "tiny"
    tokenizer = load_tokenizer()
    prompts = make_prompts(tokenizer, sizes)
    log("radixgate --spec ngram: drafts off and on, interleaved")
    runs: dict[str, dict] = run_radixgate(prompts, sizes, tiny, repeat)
    if llama_binary:
        for spec_type in (None, *LLAMA_SPEC_TYPES):
            name = f"llama_{spec_type or 'none'}".replace("-", "_")
            log(name)
            runs[name] = run_llama(llama_binary, spec_type, prompts, sizes)
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mode": mode,
            "machine": machine_info(), "threads": THREADS, "repeat": repeat,
            "prompt_tokens": {k: (len(v) if k != "streams" else [len(p) for p in v])
                              for k, v in prompts.items()},
            "code_edit_copied_share": answer_copy_share(prompts, sizes, tiny, tokenizer),
            "peer": ({"binary": str(llama_binary)} if llama_binary
                     else {"skipped": LLAMA_SERVER_BUILD_NOTE}),
            "runs": runs, "summary": summarize(runs)}


def markdown(report: dict) -> str:
    names = list(report["runs"])
    lines = ["| workload | " + " | ".join(names) + " | spec on / off | on / llama best |",
             "|---" * (len(names) + 3) + "|"]
    for work, entry in report["summary"].items():
        cells = [f"{report['runs'][n][work]['tok_s']:g}" for n in names]
        best = (f"{entry['spec_on_over_llama_best']}x ({entry['llama_best']})"
                if "llama_best" in entry else "-")
        lines.append(f"| {work} | " + " | ".join(cells) + f" | {entry['spec_on_over_off']}x | {best} |")
    lines.append(f"\ncode edit answer copied from the prompt (spec off): "
                 f"{report['code_edit_copied_share']}; radixgate spec counts: "
                 f"{report['runs']['radixgate_ngram'].get('spec_counts')}")
    lines.append(f"machine: {report['machine']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="random tiny model, radixgate only")
    parser.add_argument("--llama-server", type=Path, help="the llama-server binary")
    parser.add_argument("--no-peer", action="store_true", help="radixgate only")
    parser.add_argument("--repeat", type=int, default=3,
                        help="passes of radixgate's off / on pairs (medians reported)")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else "default"
    skip_peer = args.no_peer or args.tiny
    binary = peer_binary(args.llama_server, skip_peer)
    report = run_benchmark(mode, binary, log=lambda m: print(m, file=sys.stderr, flush=True),
                           repeat=1 if args.tiny else args.repeat)
    save_report(report, args.out, "spec_bench", mode, argv or sys.argv[1:])
    print(markdown(report))


if __name__ == "__main__":
    main()
