"""The soak load generator: N concurrent aiohttp clients against a running gateway.

Each client loops until the deadline, picking per request: a tenant, an API
(/v1/messages or /v1/chat/completions), streaming or not, and with small probabilities a
mid-stream disconnect or a malformed body. Prompts share per-tenant prefixes (so the cache
hits) with random suffixes of random length (so the tiny KV budget evicts and preempts).

``run_load(...)`` returns a ``LoadReport``: outcomes by kind, latencies of complete
answers, and every violation (5xx other than overloaded, an error outside its envelope, a
malformed request answered 200, a broken stream, a request that hung past its timeout).
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from tests.support import client as c

MALFORMED_BODIES = (
    "{not json",
    json.dumps({"model": c.MODEL, "max_tokens": -1, "messages": [{"role": "user", "content": "x"}]}),
    json.dumps({"model": c.MODEL, "max_tokens": 4, "messages": "hello"}),
    json.dumps({"model": c.MODEL, "max_tokens": 4, "messages": []}),
    json.dumps({"model": c.MODEL, "max_tokens": 4, "temperature": "hot",
                "messages": [{"role": "user", "content": "x"}]}),
    json.dumps({"model": "no-such-model", "max_tokens": 4,
                "messages": [{"role": "user", "content": "x"}]}),
    json.dumps({"model": c.MODEL, "max_tokens": 4,
                "messages": [{"role": "robot", "content": "x"}]}),
    json.dumps([1, 2, 3]),
)


@dataclass
class LoadConfig:
    base_url: str
    tenant_keys: dict[str, str]          # tenant -> API key
    seconds: float = 15.0
    clients: int = 32
    max_tokens: int = 12
    long_rate: float = 0.10              # share of requests allowed a longer answer, so
    long_max_tokens: int = 192           # decoding outgrows the KV budget (preemption)
    disconnect_rate: float = 0.10
    malformed_rate: float = 0.05
    stream_rate: float = 0.5
    request_timeout_s: float = 90.0      # longer than this = hung
    seed: int = 1234
    prefix_words: int = 60               # shared per-tenant prefix length (words)
    max_suffix_words: int = 120
    admin_key: str | None = None         # set: an admin client interleaves integrity checks,
    admin_interval_s: float = 1.0        # flushes, prefix publish/unpin with the load


@dataclass
class LoadReport:
    outcomes: Counter = field(default_factory=Counter)    # kind -> count
    statuses: Counter = field(default_factory=Counter)    # HTTP status -> count
    latencies_s: list[float] = field(default_factory=list)  # complete answers only
    violations: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def requests(self) -> int:
        """Generation requests sent (the admin client's operations not included)."""
        return sum(n for kind, n in self.outcomes.items() if not kind.startswith("admin_"))

    @property
    def served(self) -> int:
        return self.outcomes["ok"]

    def percentile(self, q: float) -> float:
        if not self.latencies_s:
            return 0.0
        xs = sorted(self.latencies_s)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    def summary(self) -> dict:
        errors = {kind: n for kind, n in self.outcomes.items()
                  if kind != "ok" and not kind.startswith("admin_")}
        return {"requests": self.requests, "served": self.served, "errors_by_kind": errors,
                "outcomes": dict(self.outcomes), "statuses": dict(self.statuses),
                "p50_s": round(self.percentile(0.50), 3), "p99_s": round(self.percentile(0.99), 3),
                "throughput_rps": round(self.served / self.wall_s, 2) if self.wall_s else 0.0,
                "violations": len(self.violations)}


async def run_load(cfg: LoadConfig) -> LoadReport:
    """Drive the server for ``cfg.seconds`` with ``cfg.clients`` concurrent clients."""
    report = LoadReport()
    prefixes = _tenant_prefixes(cfg)
    connector = aiohttp.TCPConnector(limit=cfg.clients + 8)
    start = time.monotonic()
    deadline = start + cfg.seconds
    async with aiohttp.ClientSession(connector=connector) as session:
        loops = [_client_loop(session, cfg, report, prefixes, deadline, random.Random(cfg.seed + i))
                 for i in range(cfg.clients)]
        if cfg.admin_key:
            loops.append(_admin_loop(session, cfg, report, prefixes, deadline))
        await asyncio.gather(*loops)
    report.wall_s = time.monotonic() - start
    return report


def _tenant_prefixes(cfg: LoadConfig) -> dict[str, list[str]]:
    rng = random.Random(cfg.seed)
    return {t: [c.words(rng, cfg.prefix_words) for _ in range(2)] for t in cfg.tenant_keys}


async def _client_loop(session, cfg, report, prefixes, deadline, rng) -> None:
    while time.monotonic() < deadline:
        tenant = rng.choice(sorted(cfg.tenant_keys))
        kind, status, detail, latency = await _one_request(
            session, cfg, cfg.tenant_keys[tenant], rng.choice(prefixes[tenant]), rng)
        report.outcomes[kind] += 1
        if status:
            report.statuses[status] += 1
        if kind == "ok":
            report.latencies_s.append(latency)
        if detail:
            report.violations.append(detail)


async def _admin_loop(session, cfg, report, prefixes, deadline) -> None:
    """While the load runs: integrity checks (must stay clean with requests in flight),
    flushes of one tenant or everything, and publish/unpin of a public prefix."""
    rng = random.Random(cfg.seed - 1)
    base, key = cfg.base_url, cfg.admin_key
    while time.monotonic() < deadline:
        await asyncio.sleep(rng.uniform(0.5, 1.5) * cfg.admin_interval_s)
        action = rng.choice(("integrity", "integrity", "flush_tenant", "flush_all", "publish",
                             "unpin"))
        tenant = rng.choice(sorted(cfg.tenant_keys))
        prefix = {"system": rng.choice(prefixes[tenant]), "ttl_s": 30}
        try:
            if action == "integrity":
                problem = await c.integrity_violation(session, base, key)
                status = 0 if problem else 200
            else:
                path, method, body = {
                    "flush_tenant": ("/v1/cache/flush", "POST", {"tenant": tenant}),
                    "flush_all": ("/v1/cache/flush", "POST", {}),
                    "publish": ("/v1/cache/prefixes", "POST", prefix),
                    "unpin": ("/v1/cache/prefixes", "DELETE", prefix)}[action]
                async with session.request(method, base + path, headers=c.headers(key),
                                           json=body) as r:
                    status, text = r.status, await r.text()
                problem = None if status == 200 else f"admin {action} -> {status}: {text[:200]}"
        except aiohttp.ClientError as e:
            status, problem = 0, f"admin {action} transport error: {e}"
        report.outcomes[f"admin_{action}"] += 1
        if problem:
            report.violations.append(problem)


async def _one_request(session, cfg, key, prefix, rng):
    """-> (outcome kind, HTTP status or 0, violation or None, latency seconds)."""
    path = rng.choice((c.ANTHROPIC_PATH, c.CHAT_PATH))
    stream = rng.random() < cfg.stream_rate
    roll = rng.random()
    malformed = roll < cfg.malformed_rate
    disconnect = not malformed and roll < cfg.malformed_rate + cfg.disconnect_rate
    prompt = c.words(rng, rng.randint(1, cfg.max_suffix_words))
    long = rng.random() < cfg.long_rate
    max_tokens = rng.randint(1, cfg.long_max_tokens if long else cfg.max_tokens)
    build = c.anthropic_body if path == c.ANTHROPIC_PATH else c.chat_body
    data = (rng.choice(MALFORMED_BODIES) if malformed else
            json.dumps(build(prompt, system=prefix, max_tokens=max_tokens, stream=stream)))
    t0 = time.monotonic()
    try:
        return await asyncio.wait_for(
            _exchange(session, cfg.base_url + path, key, data, path, stream, max_tokens,
                      malformed, disconnect, rng, t0),
            cfg.request_timeout_s)
    except asyncio.TimeoutError:
        return "hung", 0, f"request hung > {cfg.request_timeout_s}s ({path}, stream={stream})", 0.0
    except aiohttp.ClientError as e:
        return "transport_error", 0, f"transport error {type(e).__name__}: {e} ({path})", 0.0


async def _exchange(session, url, key, data, path, stream, max_tokens, malformed, disconnect,
                    rng, t0):
    if disconnect and not stream:
        return await _disconnect_non_streaming(session, url, key, data, path, max_tokens, rng)
    async with session.post(url, headers=c.headers(key), data=data) as resp:
        if disconnect and resp.status == 200:
            await resp.content.readany()      # first bytes of the stream, then hang up
            resp.close()
            return "disconnected", 200, None, 0.0
        text = await resp.text()
    latency = time.monotonic() - t0
    violation = c.check_answer(path, stream, resp.status, text, max_tokens)
    if malformed and resp.status == 200:
        violation = f"malformed request answered 200: {data[:120]}"
    if violation:
        return "violation", resp.status, violation, latency
    if malformed:
        return "rejected_malformed", resp.status, None, latency
    if resp.status != 200:
        return f"error_{resp.status}", resp.status, None, latency
    if stream and c.stream_ended_in_error(text):
        return "stream_error", resp.status, None, latency
    return "ok", resp.status, None, latency


async def _disconnect_non_streaming(session, url, key, data, path, max_tokens, rng):
    """Hang up on a non-streaming request before (or as) it completes."""
    try:
        async with asyncio.timeout(rng.uniform(0.02, 0.5)):
            async with session.post(url, headers=c.headers(key), data=data) as resp:
                text = await resp.text()
    except TimeoutError:
        return "disconnected", 0, None, 0.0
    violation = c.check_answer(path, False, resp.status, text, max_tokens)
    return ("violation" if violation else "completed_before_disconnect"), resp.status, violation, 0.0
