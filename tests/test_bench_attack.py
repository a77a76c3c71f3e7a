"""The attack benchmark at a minimal size: its report has the documented shape
and every attacker and victim request is counted exactly once. No timing assertions: the
latency ratios are the benchmark's output, not a pass/fail criterion here."""
from __future__ import annotations

import asyncio
import dataclasses

from benchmarks.attack_bench import (ATTACKS, RequestPool, Size, markdown_table, run_attack,
                                     raise_fd_limit)

TINY = Size(probe_requests=3, sampling_requests=4, slow_bodies=2, stuck_streams=2,
            slow_hold_s=0.5, probe_budget_s=20.0, grace_s=0.5)

PHASE_KEYS = {"victim_p50_ms", "victim_max_ms", "victim_statuses", "victim_failed",
              "attacker_sent", "attacker_statuses", "attacker_wall_s", "server_5xx",
              "server_log_errors"}


@dataclasses.dataclass
class SleepRequest:
    seconds: float

    async def send(self, session, base: str) -> str:
        await asyncio.sleep(self.seconds)
        return "200"


async def test_pool_counts_finished_cancelled_and_unsent_requests_once():
    requests = [SleepRequest(0.0)] * 3 + [SleepRequest(30.0)] * 2 + [SleepRequest(0.0)] * 4
    pool = RequestPool(None, "", requests, concurrency=2).start()
    await pool.join(0.3)
    await pool.stop()
    assert pool.outcomes == {"200": 3, "cancelled": 2, "not_sent": 4}


def assert_phase_adds_up(phase: dict, sent: int) -> None:
    assert PHASE_KEYS <= phase.keys()
    assert sum(phase["victim_statuses"].values()) == TINY.probe_requests
    assert phase["victim_failed"] == TINY.probe_requests - phase["victim_statuses"].get("200", 0)
    assert phase["attacker_sent"] == sent
    assert sum(phase["attacker_statuses"].values()) == sent
    assert phase["server_5xx"] <= sent + TINY.probe_requests


async def test_sampling_attack_report_counts_every_request():
    report = await run_attack("sampling", TINY)
    assert report["attack"] == "sampling"
    for phase in (report["control"], report["attack_phase"]):
        assert_phase_adds_up(phase, TINY.sampling_requests)
    control, attacked = report["control"], report["attack_phase"]
    if control["victim_p50_ms"] and attacked["victim_p50_ms"] is not None:
        assert report["ratio_p50"] == round(attacked["victim_p50_ms"] / control["victim_p50_ms"], 2)
    table = markdown_table([report])
    assert table.count("\n") == 2 and "| sampling |" in table


async def test_slow_client_attack_counts_raw_socket_outcomes():
    raise_fd_limit()
    report = await run_attack("slow_clients", TINY)
    sent = TINY.slow_bodies + TINY.stuck_streams
    for phase in (report["control"], report["attack_phase"]):
        assert_phase_adds_up(phase, sent)
    assert set(ATTACKS) >= {"sampling", "slow_clients"}
