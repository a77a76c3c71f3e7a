"""Request-level checkpoints: a cache-off pair killed mid-way resumes with only the requests
it had not answered, and its summary counts every request once."""
import asyncio
import json
import socket
import threading
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from aiohttp import web

from benchmarks import run_all
from benchmarks.checkpoint import PairCheckpoint, saved_requests
from benchmarks.http_runner import ClientConfig, run_workload
from benchmarks.workloads import make_workloads
from tests.test_bench_http import scripted_app
from tests.test_bench_resume import BASE, fake_variants


class Killed(Exception):
    pass


class KillAfter:
    """A progress bar that raises after ``n`` answered requests, as a kill would stop a run."""

    def __init__(self, n: int):
        self.n = n

    def update(self, k: int) -> None:
        self.n -= k
        if self.n <= 0:
            raise Killed


def agents_workload():
    return make_workloads(quick=True, seed=0, names=("agents",))[0]


def test_checkpoint_sums_segments_and_skips_failed_cut_and_foreign_lines(tmp_path):
    workload = agents_workload()
    ok = {"session": workload.requests[0].session, "ok": True, "prompt_tokens": 10,
          "cache_read_tokens": 0, "output_tokens": 3, "ttft_s": 0.1, "itl_s": 0.01}
    clock = iter([100.0, 104.0, 109.0])           # the server's CPU seconds
    first = PairCheckpoint.open(tmp_path, "cache_off", workload)
    first.start_segment(lambda: next(clock))
    first.record(0, ok, elapsed_s=2.0, kv_blocks_peak=7)
    first.record(1, {**ok, "ok": False}, elapsed_s=2.5, kv_blocks_peak=7)   # sent again
    first.record(2, {**ok, "session": workload.requests[2].session}, 3.0, 9)
    with first.path.open("a") as f:
        f.write(json.dumps({"index": 3, "segment": 0, "elapsed_s": 1.0, "cpu_s": 1.0,
                            "kv_blocks_peak": 1, **ok, "session": "another workload's"})
                + "\n")
        f.write('{"index": 4, "segm')                            # cut short by a kill

    second = PairCheckpoint.open(tmp_path, "cache_off", workload)
    assert sorted(second.done) == [0, 2]
    assert (second.prior_wall_s, second.prior_cpu_s, second.prior_kv_blocks_peak) == (3.0, 9.0, 9)
    assert second.segments == 1
    second.start_segment(lambda: 50.0)
    second.record(5, {**ok, "session": workload.requests[5].session}, 1.5, 4)

    third = PairCheckpoint.open(tmp_path, "cache_off", workload)
    assert sorted(third.done) == [0, 2, 5] and third.segments == 2
    assert third.prior_wall_s == pytest.approx(4.5) and third.prior_cpu_s == pytest.approx(9.0)
    assert saved_requests(tmp_path) == {"cache_off/agents": 4}   # lines, not matched to
                                                                 # a workload
    third.discard()
    assert not third.path.exists() and saved_requests(tmp_path) == {}


async def test_a_killed_pair_resumes_with_only_the_unanswered_requests(aiohttp_server, tmp_path):
    seen: list = []
    server = await aiohttp_server(scripted_app(seen))
    workload = agents_workload()
    n = len(workload.requests)
    cfg = ClientConfig(str(server.make_url("")).rstrip("/"), concurrency=3,
                       api_keys={r.tenant: "k" for r in workload.requests})
    with pytest.raises(Killed):
        await run_workload(cfg, workload, KillAfter(5),
                           checkpoint=PairCheckpoint.open(tmp_path, "cache_off", workload))
    await asyncio.sleep(0.1)                       # requests left in flight end or not
    saved = PairCheckpoint.open(tmp_path, "cache_off", workload)
    assert 5 <= len(saved.done) < n
    seen.clear()

    summary = await run_workload(cfg, workload, checkpoint=saved)
    assert len(seen) == n - len(saved.done)        # nothing answered is sent twice
    assert summary["requests"] == n and summary["errors"] == 0
    assert summary["prompt_tokens"] == 10 * n and summary["output_tokens"] == 3 * n
    assert summary["resumed"] == {"requests_saved": len(saved.done), "segments": 2}
    assert summary["wall_s"] >= saved.prior_wall_s
    assert summary["server_hit_rate"] is None     # the server's counters saw one segment


@contextmanager
def threaded_server(app: web.Application):
    """``app`` served on a loopback port from a thread (for code that calls asyncio.run)."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    loop.run_until_complete(web.SockSite(runner, sock).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_only_a_server_without_a_cache_is_checkpointed_and_cpu_adds_up(tmp_path):
    workload = agents_workload()
    n = len(workload.requests)
    cpu = [0.0]

    def cpu_seconds():
        cpu[0] += 1.0                             # one CPU second per reading
        return cpu[0]

    server = SimpleNamespace(cpu_seconds=cpu_seconds)
    with threaded_server(scripted_app([])) as url:
        cfg = ClientConfig(url, api_keys={r.tenant: "k" for r in workload.requests})
        summary, checkpoint = run_all.measure_workload(server, cfg, "radixgate", workload,
                                                       tmp_path, None)
        assert checkpoint is None and not (tmp_path / "partial").exists()
        assert summary["requests"] == n and "resumed" not in summary
        with pytest.raises(Killed):
            run_all.measure_workload(server, cfg, "cache_off", workload, tmp_path, KillAfter(4))
        saved = PairCheckpoint.open(tmp_path, "cache_off", workload)
        summary, checkpoint = run_all.measure_workload(server, cfg, "cache_off", workload,
                                                       tmp_path, None)
    assert summary["requests"] == n and summary["resumed"]["requests_saved"] == len(saved.done)
    assert summary["cpu_s"] > saved.prior_cpu_s > 0
    assert checkpoint.path == saved.path


def test_a_run_that_starts_over_drops_unfinished_pairs_and_a_resumed_one_names_them(
        tmp_path, monkeypatch, capsys):
    args = BASE + ["--out", str(tmp_path)]
    monkeypatch.setattr(run_all, "run_variant", fake_variants([]))
    run_all.run(args)
    partial = tmp_path / "partial" / "cache_off.agents.jsonl"
    partial.parent.mkdir()
    partial.write_text(json.dumps({"index": 0, "segment": 0, "elapsed_s": 1.0,
                                   "kv_blocks_peak": None, "ok": True, "session": "s"}) + "\n")
    run_all.run(args + ["--resume"])
    assert "requests saved of unfinished pairs: cache_off/agents 1" in capsys.readouterr().err
    assert partial.exists()
    run_all.run(args)
    assert not partial.exists()
