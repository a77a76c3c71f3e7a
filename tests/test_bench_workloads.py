"""Smoke tests of the benchmark workload generators, request bodies and token traces."""
import random
from collections import Counter

import pytest

from benchmarks.bodies import anthropic_body, openai_body
from benchmarks.traces import load_tokenizer, workload_trace
from benchmarks.workloads import QUICK, WORKLOAD_NAMES, ChatRequest, interleave, make_workloads


@pytest.fixture(scope="module")
def quick():
    return {w.name: w for w in make_workloads(quick=True, seed=3)}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_same_seed_gives_identical_requests_and_other_seed_differs():
    first = make_workloads(quick=True, seed=11)
    again = make_workloads(quick=True, seed=11)
    other = make_workloads(quick=True, seed=12)
    assert [w.requests for w in first] == [w.requests for w in again]
    for a, b in zip(first, other):
        assert a.requests != b.requests, a.name


def test_one_workload_does_not_change_when_others_are_left_out():
    alone = make_workloads(quick=True, seed=5, names=("doc_qa",))[0]
    together = {w.name: w for w in make_workloads(quick=True, seed=5)}["doc_qa"]
    assert alone.requests == together.requests


def test_shared_system_prompt_is_common_and_questions_differ(quick):
    reqs = quick["shared_system"].requests
    assert len(reqs) == QUICK.num_users
    assert len({r.system for r in reqs}) == 1
    assert len({r.messages[0]["content"] for r in reqs}) > len(reqs) // 2


def test_multi_turn_turns_resend_the_whole_history(quick):
    for turns in quick["multi_turn"].sessions().values():
        assert len(turns) == QUICK.chat_turns
        for before, after in zip(turns, turns[1:]):
            assert after.messages[:len(before.messages)] == before.messages
            assert len(after.messages) == len(before.messages) + 2


def test_agents_have_own_tools_per_tenant_and_are_interleaved(quick):
    reqs = quick["agents"].requests
    tools_by_tenant = {}
    for r in reqs:
        tools_by_tenant.setdefault(r.tenant, set()).add((r.system, repr(r.tools)))
    assert len(tools_by_tenant) == QUICK.num_tenants
    assert all(len(prefixes) == 1 for prefixes in tools_by_tenant.values())
    switches = sum(a.tenant != b.tenant for a, b in zip(reqs, reqs[1:]))
    assert switches > QUICK.num_tenants          # not one tenant after the other
    for steps in quick["agents"].sessions().values():
        assert len(steps) == QUICK.tool_calls_per_loop + 1
        last = steps[-1].messages
        kinds = [b["type"] for m in last[1:] for b in m["content"]]
        assert kinds.count("tool_use") == kinds.count("tool_result") == QUICK.tool_calls_per_loop


def test_doc_qa_popularity_is_skewed(quick):
    docs = Counter(r.messages[0]["content"].split("\n\nQuestion:")[0]
                   for r in quick["doc_qa"].requests)
    counts = sorted(docs.values(), reverse=True)
    assert counts[0] >= 3 * counts[-1]
    assert len(docs) < QUICK.doc_questions


def test_control_prompts_share_no_text(quick):
    reqs = quick["control"].requests
    assert len({r.system for r in reqs}) == len(reqs)
    assert len({r.messages[0]["content"] for r in reqs}) == len(reqs)


def test_openai_body_maps_tool_use_and_results_to_tool_calls(quick):
    req = quick["agents"].sessions()[next(iter(quick["agents"].sessions()))][-1]
    body = openai_body(req, "m")
    calls = [c for m in body["messages"] for c in m.get("tool_calls", [])]
    results = [m for m in body["messages"] if m["role"] == "tool"]
    assert len(calls) == len(results) == QUICK.tool_calls_per_loop
    assert [c["id"] for c in calls] == [m["tool_call_id"] for m in results]
    assert body["tools"][0]["type"] == "function"
    assert body["stream_options"] == {"include_usage": True}


def test_anthropic_body_marks_system_and_tools_with_cache_control(quick):
    req = quick["agents"].requests[0]
    plain = anthropic_body(req, "m")
    marked = anthropic_body(req, "m", cache_control=True)
    assert plain["system"] == req.system and "cache_control" not in plain["tools"][-1]
    assert marked["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert marked["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in req.tools[-1]        # the request itself is not mutated


def test_quick_mode_shared_prefixes_stay_near_512_tokens(quick, tokenizer):
    system_tokens = len(tokenizer.encode(quick["shared_system"].requests[0].system))
    assert 350 <= system_tokens <= 600


def test_trace_of_a_later_turn_extends_the_earlier_turn_tokens(quick, tokenizer):
    trace = workload_trace(quick["multi_turn"], tokenizer)
    by_session = {}
    for entry in trace:
        by_session.setdefault(entry.session, []).append(entry.tokens)
    for turns in by_session.values():
        for before, after in zip(turns, turns[1:]):
            shared = len(before) - 3                   # all but the generation prompt
            assert after[:shared] == before[:shared]


def test_trace_namespaces_are_tenants(quick, tokenizer):
    trace = workload_trace(quick["agents"], tokenizer)
    assert {e.namespace for e in trace} == {r.tenant for r in quick["agents"].requests}
    assert all(len(e.tokens) > 300 for e in trace)


def test_every_workload_is_generated():
    assert [w.name for w in make_workloads(quick=True)] == list(WORKLOAD_NAMES)


def _open_sessions_over_time(order):
    """Most sessions that had started and not yet sent their last request, at any point."""
    last = {r.session: i for i, r in enumerate(order)}
    first = {}
    for i, r in enumerate(order):
        first.setdefault(r.session, i)
    return max(sum(first[s] <= i <= last[s] for s in first) for i in range(len(order)))


@pytest.mark.parametrize("live", [1, 3, 0])
def test_interleave_opens_at_most_live_sessions_and_keeps_each_sessions_order(live):
    sessions = [[ChatRequest(f"s{s}", "t", "", ({"turn": t},)) for t in range(4)]
                for s in range(7)]
    order = interleave(sessions, random.Random(1), live)
    assert sorted(order, key=lambda r: r.session) == [r for s in sessions for r in s]
    for s in sessions:
        assert [r for r in order if r.session == s[0].session] == s
    overlap = _open_sessions_over_time(order)
    assert overlap == live if live else overlap > 3


def test_live_sessions_override_changes_only_the_arrival_order():
    staggered = make_workloads(quick=False, seed=2, names=("multi_turn",))[0]
    all_open = make_workloads(quick=False, seed=2, names=("multi_turn",), live_sessions=0)[0]
    assert staggered.requests != all_open.requests
    assert staggered.sessions() == all_open.sessions()
    assert _open_sessions_over_time(staggered.requests) == 8
