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
from benchmarks.checkpoint import PairCheckpoint, Unsaved, checkpoint_path
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


def workload(name="multi_turn"):
    return make_workloads(quick=True, seed=0, names=(name,))[0]


OK = {"ok": True, "prompt_tokens": 10, "cache_read_tokens": 0, "output_tokens": 3,
      "ttft_s": 0.1, "itl_s": 0.01, "session": "s"}


def test_checkpoint_sums_segments_and_drops_failed_cut_and_foreign_lines(tmp_path):
    w = workload()
    clock = iter([100.0, 104.0, 109.0])           # the server's CPU seconds
    first = PairCheckpoint.open(tmp_path, "cache_off", w)
    first.start_segment(lambda: next(clock))
    first.record(0, OK, elapsed_s=2.0, kv_blocks_peak=7)
    first.record(1, {**OK, "ok": False}, elapsed_s=2.5, kv_blocks_peak=7)   # sent again
    first.record(2, OK, 3.0, 9)
    lines = first.path.read_text().splitlines()
    foreign = {**json.loads(lines[0]), "index": 3}          # request 0's digest at 3
    with first.path.open("a") as f:
        f.write(json.dumps(foreign) + "\n")
        f.write('{"index": 4, "segm')                        # cut short by a kill

    second = PairCheckpoint.open(tmp_path, "cache_off", w)
    assert sorted(second.done) == [0, 2]
    assert (second.prior_wall_s, second.prior_cpu_s, second.prior_kv_blocks_peak) == (3.0, 9.0, 9)
    assert second.segments == 1 and second.done[0] == OK
    second.start_segment(iter([50.0, 51.0, 53.5]).__next__)
    second.record(5, OK, 1.5, 4)                             # appended after the cut line
    assert second.total_cpu_s() == pytest.approx(9.0 + 3.5)   # earlier segments + this one

    third = PairCheckpoint.open(tmp_path, "cache_off", w)
    assert sorted(third.done) == [0, 2, 5] and third.segments == 2
    assert third.prior_wall_s == pytest.approx(4.5) and third.prior_cpu_s == pytest.approx(10.0)
    changed = make_workloads(quick=True, seed=1, names=("multi_turn",))[0]
    assert PairCheckpoint.open(tmp_path, "cache_off", changed).done == {}
    third.discard()
    assert not third.path.exists()


def test_an_unsaved_pair_counts_the_cpu_of_its_one_segment():
    run = Unsaved()
    assert run.total_cpu_s() is None                         # no clock started
    run.start_segment(iter([10.0, 12.5]).__next__)
    assert run.total_cpu_s() == 2.5 and run.done == {} and run.prior_wall_s == 0.0


async def test_a_killed_pair_resumes_with_only_the_unanswered_requests(aiohttp_server, tmp_path):
    seen: list = []
    server = await aiohttp_server(scripted_app(seen))
    w = workload()
    n = len(w.requests)
    cfg = ClientConfig(str(server.make_url("")).rstrip("/"), concurrency=2)
    with pytest.raises(Killed):
        await run_workload(cfg, w, KillAfter(4),
                           checkpoint=PairCheckpoint.open(tmp_path, "cache_off", w))
    saved = PairCheckpoint.open(tmp_path, "cache_off", w)
    assert 4 <= len(saved.done) <= 5 < n                     # the kill stopped the sending
    for session in {r.session for r in w.requests}:          # a session's saved turns are
        turns = [i for i, r in enumerate(w.requests) if r.session == session]   # its first
        assert sorted(i for i in turns if i in saved.done) == turns[:len(
            [i for i in turns if i in saved.done])]
    seen.clear()

    summary = await run_workload(cfg, w, checkpoint=saved)
    assert len(seen) == n - len(saved.done)                  # nothing answered is sent twice
    assert summary["requests"] == n and summary["errors"] == 0
    assert summary["prompt_tokens"] == 10 * n and summary["output_tokens"] == 3 * n
    assert summary["resumed"] == {"requests_saved": len(saved.done), "segments": 2}
    assert summary["wall_s"] >= saved.prior_wall_s > 0
    assert summary["kv_blocks_peak"] == 10
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


def flaky_app(failing_calls: set[int], answered: list) -> web.Application:
    """``scripted_app`` whose n-th ``/v1/messages`` call (from 1, warm-up included) answers
    529 when n is in ``failing_calls``; ``answered[0]`` counts the others."""
    app = scripted_app([])
    calls = [0]

    @web.middleware
    async def fail_some(request, handler):
        if request.path != "/v1/messages":
            return await handler(request)
        calls[0] += 1
        if calls[0] in failing_calls:
            return web.json_response({"type": "error", "error": {
                "type": "overloaded_error", "message": "busy"}}, status=529)
        response = await handler(request)
        answered[0] += 1
        return response

    app.middlewares.append(fail_some)
    return app


def fake_bench_server(url: str, answered: list):
    class FakeServer:
        """``BenchServer`` stand-in: the app at ``url``; 2 CPU seconds per answer."""
        base_url = url

        def __init__(self, *args, **kwargs):
            pass

        def start(self):
            pass

        def stop(self):
            pass

        def cpu_seconds(self):
            return 2.0 * answered[0]
    return FakeServer


def test_failed_requests_of_a_cache_off_pair_are_all_that_run_again(tmp_path, monkeypatch):
    w = workload()
    n = len(w.requests)
    answered = [0]
    args = SimpleNamespace(tiny=False, kv_cache_gb=1.0, concurrency=2, cache_control=False,
                           out=tmp_path)
    with threaded_server(flaky_app({3, 6}, answered)) as url:
        monkeypatch.setattr(run_all, "BenchServer", fake_bench_server(url, answered))
        out = {"workloads": {}}
        run_all.run_variant("cache_off", [w], args, out)
        first = out["workloads"]["multi_turn"]
        assert first["errors"] == 2 and first["cpu_s"] == 2.0 * (n - 2)
        assert len(PairCheckpoint.open(tmp_path, "cache_off", w).done) == n - 2

        answered[0] = 0
        run_all.run_variant("cache_off", [w], args, out)
        again = out["workloads"]["multi_turn"]
        assert answered[0] == 1 + 2                           # warm-up + the two failures
        assert again["errors"] == 0 and again["requests"] == n
        assert again["prompt_tokens"] == 10 * n and again["cpu_s"] == 2.0 * n
        assert not checkpoint_path(tmp_path, "cache_off", "multi_turn").exists()

        run_all.run_variant("radixgate", [w], args, {"workloads": {}})
    assert not checkpoint_path(tmp_path, "radixgate", "multi_turn").exists()


def test_resuming_drops_files_of_finished_pairs_and_starting_over_drops_all(
        tmp_path, monkeypatch):
    args = BASE + ["--out", str(tmp_path)]
    monkeypatch.setattr(run_all, "run_variant", fake_variants([]))
    run_all.run(args)                                        # all pairs finished
    left = checkpoint_path(tmp_path, "cache_off", "control")   # killed before discard
    unfinished = checkpoint_path(tmp_path, "cache_off", "agents")
    left.parent.mkdir()
    left.write_text("{}\n")
    unfinished.write_text("{}\n")
    run_all.run(args + ["--resume"])
    assert not left.exists() and unfinished.exists()
    run_all.run(args)
    assert not unfinished.exists()
