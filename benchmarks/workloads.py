"""Seeded prefix-sharing workloads: chat requests in arrival order.

Five workloads, each a list of ``ChatRequest`` in the order a client sends them:

1. ``shared_system``  one long system prompt shared by many users asking short questions;
2. ``multi_turn``     conversations that re-send their whole history every turn;
3. ``agents``         tenants with their own tools + system prefix, agent loops appending
                      tool calls and observations, tenants interleaved;
4. ``doc_qa``         a shared few-shot prefix, documents picked with Zipf popularity, several
                      questions per document;
5. ``control``        unique prompts, nothing to share.

Messages are stored in Anthropic Messages form (``benchmarks.bodies`` converts them to
OpenAI bodies). Requests of one ``session`` depend on each other (a turn is sent after the
previous one finished); sessions are independent. Arrivals: sessions open over time, at
most ``Scale.live_sessions`` at once (users come and go: when one conversation or agent
loop ends, the next opens); each next request comes from an open session picked at random.
``live_sessions=0`` opens every session at once (no temporal locality at all: the worst
case for any online eviction policy, reported as a stress variant).
``make_workloads(quick, seed)`` is fully deterministic: the same seed gives byte-identical
requests.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from benchmarks.text import NAMES, TextGen

WORKLOAD_NAMES = ("shared_system", "multi_turn", "agents", "doc_qa", "control")


@dataclass(frozen=True)
class ChatRequest:
    session: str                      # requests of one session run in order
    tenant: str
    system: str
    messages: tuple[dict, ...]        # Anthropic-shaped messages
    tools: tuple[dict, ...] = ()      # Anthropic-shaped tool definitions
    max_tokens: int = 16


@dataclass(frozen=True)
class Scale:
    """Sizes (approximate tokens / counts) of one benchmark mode."""

    system_tokens: int          # workload 1 shared system prompt
    num_users: int
    chat_conversations: int     # workload 2
    chat_turns: int
    chat_reply_tokens: int
    num_tenants: int            # workload 3
    tenant_prefix_tokens: int
    loops_per_tenant: int
    tool_calls_per_loop: int
    observation_tokens: int
    num_documents: int          # workload 4
    document_tokens: int
    fewshot_tokens: int
    doc_questions: int
    zipf_s: float
    control_requests: int       # workload 5
    control_tokens: int
    max_tokens: int
    live_sessions: int          # sessions open at once (0: all; see the module docstring)


QUICK = Scale(system_tokens=400, num_users=12, chat_conversations=3, chat_turns=4,
              chat_reply_tokens=40, num_tenants=2, tenant_prefix_tokens=320,
              loops_per_tenant=1, tool_calls_per_loop=3, observation_tokens=30,
              num_documents=8, document_tokens=250, fewshot_tokens=100, doc_questions=12,
              zipf_s=1.1, control_requests=6, control_tokens=300, max_tokens=8,
              live_sessions=2)
FULL = Scale(system_tokens=2000, num_users=256, chat_conversations=24, chat_turns=10,
             chat_reply_tokens=150, num_tenants=8, tenant_prefix_tokens=3000,
             loops_per_tenant=2, tool_calls_per_loop=10, observation_tokens=150,
             num_documents=50, document_tokens=1500, fewshot_tokens=400, doc_questions=300,
             zipf_s=1.1, control_requests=100, control_tokens=1500, max_tokens=64,
             live_sessions=8)
# ``run_all --full`` over HTTP with the real model: FULL's prompt lengths (2-3k-token shared
# prefixes, 1.5k-token documents, 10-turn conversations), fewer sessions and 16 output
# tokens, so the whole suite stays under 15 minutes on 2 cores. The replays (memory sweep,
# seed spread) use FULL itself: they run no model.
HTTP_FULL = replace(FULL, num_users=16, chat_conversations=3, chat_turns=8, num_tenants=2,
                    loops_per_tenant=1, tool_calls_per_loop=5, num_documents=6,
                    doc_questions=16, control_requests=6, max_tokens=16, live_sessions=4)


@dataclass
class Workload:
    name: str
    description: str
    requests: list[ChatRequest] = field(default_factory=list)

    def sessions(self) -> dict[str, list[ChatRequest]]:
        """Requests grouped by session, each group in sending order."""
        out: dict[str, list[ChatRequest]] = {}
        for req in self.requests:
            out.setdefault(req.session, []).append(req)
        return out


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def interleave(sessions: list[list[ChatRequest]], rng: random.Random,
               live_sessions: int = 0) -> list[ChatRequest]:
    """Merge sessions in a random order that keeps each session's own order: sessions open
    in list order, at most ``live_sessions`` at once (0: all at once), and each next
    request comes from an open session picked uniformly."""
    waiting = [list(s) for s in sessions if s]
    limit = live_sessions or len(waiting)
    open_: list[list[ChatRequest]] = []       # each: the session's requests not yet sent
    out = []
    while waiting or open_:
        while waiting and len(open_) < limit:
            open_.append(waiting.pop(0))
        i = rng.randrange(len(open_))
        out.append(open_[i].pop(0))
        if not open_[i]:
            del open_[i]
    return out


def shared_system(scale: Scale, rng: random.Random) -> Workload:
    gen = TextGen(rng)
    system = ("You are the support assistant of Northwind Logistics. Follow the handbook "
              "below.\n\n" + gen.document("Support handbook", scale.system_tokens))
    requests = [ChatRequest(f"user{u}", "default", system, (_user(gen.question()),),
                            max_tokens=scale.max_tokens) for u in range(scale.num_users)]
    return Workload("shared_system", f"{scale.system_tokens}-token system prompt, "
                    f"{scale.num_users} users with one short question each", requests)


def multi_turn(scale: Scale, rng: random.Random) -> Workload:
    gen = TextGen(rng)
    system = "You are a helpful assistant. Answer concisely and cite the relevant policy."
    sessions = []
    for c in range(scale.chat_conversations):
        history: list[dict] = []
        turns = []
        for _ in range(scale.chat_turns):
            history.append(_user(gen.question() + " " + gen.paragraph(20)))
            turns.append(ChatRequest(f"conv{c}", "default", system, tuple(history),
                                     max_tokens=scale.max_tokens))
            history.append(_assistant(gen.reply(scale.chat_reply_tokens)))
        sessions.append(turns)
    return Workload("multi_turn", f"{scale.chat_conversations} conversations x "
                    f"{scale.chat_turns} turns re-sending history, "
                    f"{_live(scale, len(sessions))} open at once",
                    interleave(sessions, rng, scale.live_sessions))


def _tenant_prefix(gen: TextGen, tenant: str, approx_tokens: int) -> tuple[str, tuple[dict, ...]]:
    """A tenant's system prompt and tool list, together about ``approx_tokens`` tokens."""
    tools, size = [], 0
    while size < approx_tokens * 0.6:
        tools.append(gen.tool_schema(f"{tenant}_tool_{len(tools)}"))
        size += 210   # a generated schema is about 210 tokens
    system = (f"You are the operations agent of {tenant}. Use the tools to complete the task; "
              "call one tool at a time.\n\n" + gen.document(f"{tenant} runbook",
                                                          max(60, approx_tokens - size)))
    return system, tuple(tools)


def agents(scale: Scale, rng: random.Random) -> Workload:
    gen = TextGen(rng)
    sessions = []
    for t in range(scale.num_tenants):
        tenant = f"tenant{t}_{NAMES[t % len(NAMES)].lower()}"
        system, tools = _tenant_prefix(gen, tenant, scale.tenant_prefix_tokens)
        for loop in range(scale.loops_per_tenant):
            history = [_user("Task: " + gen.question() + " " + gen.paragraph(30))]
            steps = []
            for call in range(scale.tool_calls_per_loop + 1):
                steps.append(ChatRequest(f"{tenant}/loop{loop}", tenant, system,
                                         tuple(history), tools, scale.max_tokens))
                tool = rng.choice(tools)
                call_id = f"toolu_{t}_{loop}_{call}"
                history.append({"role": "assistant", "content": [
                    {"type": "text", "text": gen.sentence()},
                    {"type": "tool_use", "id": call_id, "name": tool["name"],
                     "input": gen.tool_input(tool)}]})
                history.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call_id,
                     "content": gen.observation(scale.observation_tokens)}]})
            sessions.append(steps)
    rng.shuffle(sessions)                 # tasks of different tenants arrive mixed
    return Workload("agents", f"{scale.num_tenants} tenants, ~{scale.tenant_prefix_tokens}-token "
                    f"tools+system prefix, loops of {scale.tool_calls_per_loop} tool calls, "
                    f"{_live(scale, len(sessions))} loops open at once",
                    interleave(sessions, rng, scale.live_sessions))


def _live(scale: Scale, num_sessions: int) -> str:
    return "all" if not scale.live_sessions else str(min(scale.live_sessions, num_sessions))


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (rank ** s) for rank in range(1, n + 1)]


def doc_qa(scale: Scale, rng: random.Random) -> Workload:
    gen = TextGen(rng)
    examples = []
    while sum(len(e) for e in examples) < scale.fewshot_tokens * 5:
        examples.append(f"Q: {gen.question()}\nA: {gen.paragraph(25)}")
    system = ("Answer questions about the document using only its text. Examples:\n\n"
              + "\n\n".join(examples))
    docs = [gen.document(f"Document {d}: {gen.sentence()[:-1]}", scale.document_tokens)
            for d in range(scale.num_documents)]
    weights = zipf_weights(scale.num_documents, scale.zipf_s)
    picks = rng.choices(range(scale.num_documents), weights=weights, k=scale.doc_questions)
    requests = [ChatRequest(f"q{i}", "default", system,
                            (_user(f"{docs[d]}\n\nQuestion: {gen.question()}"),),
                            max_tokens=scale.max_tokens) for i, d in enumerate(picks)]
    return Workload("doc_qa", f"{scale.num_documents} documents (Zipf s={scale.zipf_s}), "
                    f"{scale.doc_questions} questions", requests)


def control(scale: Scale, rng: random.Random) -> Workload:
    gen = TextGen(rng)
    requests = [ChatRequest(f"c{i}", "default", gen.unique_words(scale.control_tokens // 3),
                            (_user(gen.unique_words(scale.control_tokens * 2 // 3)),),
                            max_tokens=scale.max_tokens)
                for i in range(scale.control_requests)]
    return Workload("control", f"{scale.control_requests} unique prompts", requests)


GENERATORS = {"shared_system": shared_system, "multi_turn": multi_turn, "agents": agents,
              "doc_qa": doc_qa, "control": control}


def make_workloads(quick: bool = True, seed: int = 0, scale: Scale | None = None,
                   names: tuple[str, ...] = WORKLOAD_NAMES,
                   live_sessions: int | None = None) -> list[Workload]:
    """The named workloads at ``scale`` (default QUICK or FULL; ``live_sessions``
    overrides its arrival setting); each has its own RNG derived from ``seed`` and its
    name, so adding a workload changes no other one."""
    scale = scale or (QUICK if quick else FULL)
    if live_sessions is not None:
        scale = replace(scale, live_sessions=live_sessions)
    return [GENERATORS[name](scale, random.Random(f"{seed}:{name}")) for name in names]
