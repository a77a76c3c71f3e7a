"""Tenant-isolation attack benchmark: ``python -m benchmarks.attack_bench [--quick]``.

For each attack on tenant isolation it starts ``radixgate serve --tiny`` twice on a free loopback
port (one server per phase, so phases do not share state), with two tenants: ``attacker``
(the default tenant limits but ``requests_per_minute = 0``) and ``victim`` (the default
tenant limits). In the *control* phase the attacker sends the same number of ordinary
requests at the same concurrency as in the *attack* phase; in both the victim runs the same
probe (sequential short requests: 8 output tokens, greedy, ``/v1/messages``). The report
gives the victim's p50 and max latency in each phase, their ratio attack / control (goal:
within 3x), the victim's and the attacker's outcomes by status, and the 5xx answers other
than the documented overload statuses (529 Anthropic, 503 OpenAI), which must be 0.

Attacks (``--attacks a,b`` picks some): ``sampling`` (temperature 1e-39 / 1e-320),
``huge_messages`` (3,001 short messages per body), ``stop_strings`` (2,001 long
almost-matching stop strings, and one 1 MB stop string), ``queue_flood`` (900 requests in
flight; its control sends them at the attacker's ``max_running``, the concurrency a tenant
may run), ``pins`` (the attacker pins up to its quota first), ``top_prefixes`` (30 hot
attacker prefixes hide the victim's in ``/v1/cache/stats``), ``salt_churn`` (many distinct
``cache_salt`` values: RSS, victim throughput and stats latency) and ``slow_clients``
(bodies at one byte per second, streams that are never read).

This is a benchmark, not a test: it asserts nothing about time. ``--out FILE`` writes the
JSON report; a markdown table goes to stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import resource
import socket
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import aiohttp

from radixgate.gateway.config import TenantConfig
from tests.support import client as c
from benchmarks.launch import ADMIN_KEY, ServerProcess, ServerSpec, tenant_key

ATTACKER, VICTIM = "attacker", "victim"
OVERLOAD = {529, 503}            # documented overload answers (Anthropic, OpenAI)
REQUEST_TIMEOUT_S = 30.0         # one client request, attacker or victim
MB = 1024 * 1024


@dataclass(frozen=True)
class Size:
    """How much each attack sends. ``QUICK`` ~1-2 minutes, ``DEFAULT`` under ~10."""

    probe_requests: int = 10
    sampling_requests: int = 60
    huge_requests: int = 36
    huge_messages: int = 3001
    stop_requests: int = 12
    stop_strings: int = 2001
    stop_big_bytes: int = MB
    flood_requests: int = 900
    pin_requests: int = 24
    hot_prefixes: int = 30
    hot_prefix_uses: int = 6
    salts: int = 20_000
    salt_budget_s: float = 150.0          # the churn stops here (the report says how far it got)
    slow_bodies: int = 50
    stuck_streams: int = 20
    slow_hold_s: float = 8.0              # slow clients stay connected at least this long
    burst_requests: int = 20
    probe_budget_s: float = 60.0          # the probe sends no new request after this
    grace_s: float = 5.0                  # background attackers may finish this long after it


QUICK = Size(probe_requests=5, sampling_requests=24, huge_requests=12, stop_requests=8,
             pin_requests=16, salts=2_000, salt_budget_s=40.0, slow_hold_s=4.0,
             probe_budget_s=30.0)


def server_spec(kv_cache_gb: float = 0.002) -> ServerSpec:
    """Tiny KV budget (0.002 GB: 4k tokens), max_queue 256, both tenants at the default
    tenant limits."""
    defaults = TenantConfig(name="defaults")
    limits = (("max_running", defaults.max_running),
              ("max_pinned_tokens", defaults.max_pinned_tokens),
              ("requests_per_minute", defaults.requests_per_minute))
    attacker = limits[:2] + (("requests_per_minute", 0),)
    return ServerSpec(kv_cache_gb=kv_cache_gb, max_model_len=1024, max_queue=256,
                      request_timeout_s=120.0, tenants=(ATTACKER, VICTIM),
                      tenant_overrides=((ATTACKER, attacker), (VICTIM, limits)))


# ---------------------------------------------------------------- requests

@dataclass
class Req:
    """One HTTP request of a tenant; ``send`` returns its outcome label (the status)."""

    path: str
    body: bytes | None
    tenant: str = ATTACKER
    stream: bool = False
    method: str = "POST"

    async def send(self, session: aiohttp.ClientSession, base: str) -> str:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        try:
            async with session.request(self.method, base + self.path, data=self.body,
                                       headers=c.headers(tenant_key(self.tenant)),
                                       timeout=timeout) as r:
                async for _ in r.content.iter_any():
                    pass
                return str(r.status)
        except asyncio.TimeoutError:
            return "timeout"
        except aiohttp.ClientError:
            return "conn_error"


def post(path: str, body: dict, tenant: str = ATTACKER) -> Req:
    return Req(path, json.dumps(body).encode(), tenant, stream=bool(body.get("stream")))


def prompt(rng: random.Random, tag: str, n_words: int = 12) -> str:
    return f"{tag}: {c.words(rng, n_words)}"


# ---------------------------------------------------------------- a phase

@dataclass
class PhaseResult:
    victim_latencies_s: list[float] = field(default_factory=list)
    victim_statuses: Counter = field(default_factory=Counter)
    attacker_sent: int = 0                  # requests the attacker meant to send
    attacker_statuses: Counter = field(default_factory=Counter)
    attacker_wall_s: float = 0.0
    server_5xx: int = 0                     # 5xx other than the overload statuses
    server_log_errors: int = 0              # ERROR / Traceback lines in the server log
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        lat = self.victim_latencies_s
        return {"victim_p50_ms": _ms(statistics.median(lat)) if lat else None,
                "victim_max_ms": _ms(max(lat)) if lat else None,
                "victim_statuses": dict(self.victim_statuses),
                "victim_failed": sum(n for s, n in self.victim_statuses.items() if s != "200"),
                "attacker_sent": self.attacker_sent,
                "attacker_statuses": dict(self.attacker_statuses),
                "attacker_wall_s": round(self.attacker_wall_s, 2),
                "server_5xx": self.server_5xx, "server_log_errors": self.server_log_errors,
                **self.extra}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


class RequestPool:
    """``concurrency`` workers send ``requests`` in order; every request ends in exactly one
    outcome: its status, ``timeout``, ``conn_error``, ``cancelled`` (in flight when the pool
    was stopped) or ``not_sent``."""

    def __init__(self, session, base: str, requests: list, concurrency: int):
        self.session, self.base, self.requests = session, base, requests
        self.concurrency = max(1, min(concurrency, len(requests)))
        self.outcomes: Counter = Counter()
        self.next_index = 0
        self.tasks: list[asyncio.Task] = []
        self.started = self.finished_at = time.monotonic()

    def start(self) -> "RequestPool":
        self.started = time.monotonic()
        self.tasks = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        return self

    async def _worker(self) -> None:
        while self.next_index < len(self.requests):
            request = self.requests[self.next_index]
            self.next_index += 1
            try:
                outcome = await request.send(self.session, self.base)
            except asyncio.CancelledError:
                self.outcomes[getattr(request, "outcome", None) or "cancelled"] += 1
                raise
            self.outcomes[outcome] += 1
        self.finished_at = time.monotonic()

    async def wait_started(self, settle_s: float) -> None:
        """Until every worker has a request out, then ``settle_s`` for them to arrive."""
        while self.next_index < self.concurrency and not self.done():
            await asyncio.sleep(0.01)
        await asyncio.sleep(settle_s)

    def done(self) -> bool:
        return all(t.done() for t in self.tasks)

    async def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for every request to finish (``stop`` cancels the rest)."""
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=timeout_s)

    async def stop(self) -> float:
        """Cancel what still runs; returns the pool's wall time (until it finished or
        was stopped)."""
        finished = self.done()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        wall_s = (self.finished_at if finished else time.monotonic()) - self.started
        self.outcomes["not_sent"] += len(self.requests) - self.next_index
        self.outcomes += Counter()          # drops zero counts
        return wall_s


class Phase:
    """One phase (control or attack) against one server: the attacker's pools, the
    victim's probe and whatever the attack measures besides (``result.extra``)."""

    def __init__(self, server: ServerProcess, session, size: Size, is_attack: bool):
        self.server, self.session, self.size, self.is_attack = server, session, size, is_attack
        self.base = server.base_url
        self.result = PhaseResult()
        self.rng = random.Random(21)

    @contextlib.asynccontextmanager
    async def attacker(self, requests: list, concurrency: int, settle_s: float = 0.2):
        """Attacker traffic in the background while the block runs; what still runs
        ``size.grace_s`` after it is cancelled."""
        pool = RequestPool(self.session, self.base, requests, concurrency).start()
        try:
            await pool.wait_started(settle_s)
            yield pool
            await pool.join(self.size.grace_s)
        finally:
            self._record(pool, await pool.stop())

    async def attack_to_end(self, requests: list, concurrency: int,
                            budget_s: float = 120.0) -> None:
        """Attacker traffic that completes (or runs out of ``budget_s``) before the probe."""
        pool = RequestPool(self.session, self.base, requests, concurrency).start()
        await pool.join(budget_s)
        self._record(pool, await pool.stop())

    def _record(self, pool: RequestPool, wall_s: float) -> None:
        self.result.attacker_sent += len(pool.requests)
        self.result.attacker_statuses += pool.outcomes
        self.result.attacker_wall_s += wall_s

    async def probe(self, make_body: Callable[[int], dict] | None = None) -> list[dict]:
        """The victim's sequential requests; returns their JSON answers (None if not JSON)."""
        rng = random.Random(7)            # the same probe in both phases
        answers = []
        deadline = time.monotonic() + self.size.probe_budget_s
        for i in range(self.size.probe_requests):
            if time.monotonic() > deadline:
                self.result.victim_statuses["not_sent"] += self.size.probe_requests - i
                break
            body = make_body(i) if make_body else c.anthropic_body(
                prompt(rng, f"victim probe {i}"), max_tokens=8)
            status, latency_s, answer = await self.victim_call(c.ANTHROPIC_PATH, body)
            self.result.victim_latencies_s.append(latency_s)
            self.result.victim_statuses[status] += 1
            answers.append(answer)
        return answers

    async def victim_call(self, path: str, body: dict | None, method: str = "POST"
                          ) -> tuple[str, float, dict | None]:
        started = time.monotonic()
        data = json.dumps(body).encode() if body is not None else None
        try:
            async with self.session.request(
                    method, self.base + path, data=data, headers=c.headers(tenant_key(VICTIM)),
                    timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as r:
                text = await r.text()
                status = str(r.status)
        except asyncio.TimeoutError:
            return "timeout", time.monotonic() - started, None
        except aiohttp.ClientError:
            return "conn_error", time.monotonic() - started, None
        latency_s = time.monotonic() - started
        try:
            return status, latency_s, json.loads(text)
        except ValueError:
            return status, latency_s, None

    def rss_mb(self) -> float:
        with open(f"/proc/{self.server.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
        return 0.0


# ---------------------------------------------------------------- the attacks

async def sampling(ph: Phase) -> None:
    """Streams with temperature 1e-39 (Anthropic) and 1e-320 (OpenAI) beside the victim."""
    requests = []
    for i in range(ph.size.sampling_requests):
        text = prompt(ph.rng, f"sampling {i}")
        if i % 2 == 0:
            requests.append(post(c.ANTHROPIC_PATH, c.anthropic_body(
                text, max_tokens=32, stream=True, temperature=1e-39 if ph.is_attack else 0.7)))
        else:
            requests.append(post(c.CHAT_PATH, c.chat_body(
                text, max_tokens=32, stream=True, temperature=1e-320 if ph.is_attack else 0.7)))
    async with ph.attacker(requests, concurrency=4):
        await ph.probe()


async def huge_messages(ph: Phase) -> None:
    """Bodies of 3,001 short messages (~120 KB) to count_tokens and /v1/messages."""
    n = ph.size.huge_messages if ph.is_attack else 1
    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": c.words(ph.rng, 4)} for i in range(n)]
    body = {"model": c.MODEL, "max_tokens": 8, "temperature": 0, "messages": messages}
    count_body = {"model": c.MODEL, "messages": messages}
    requests = [post(c.ANTHROPIC_PATH + "/count_tokens", count_body) if i % 2 == 0
                else post(c.ANTHROPIC_PATH, body) for i in range(ph.size.huge_requests)]
    ph.result.extra["body_kb"] = round(len(requests[0].body) / 1024, 1)
    async with ph.attacker(requests, concurrency=6):
        await ph.probe()


async def stop_strings(ph: Phase) -> None:
    """2,001 long stop strings that the greedy answer keeps almost matching (4 at a time),
    then one request with a 1 MB stop string."""
    text = prompt(ph.rng, "stop strings", 30)
    plain = c.anthropic_body(text, max_tokens=64)
    _, _, answer = await ph.victim_call(c.ANTHROPIC_PATH, {**plain})   # learn the answer
    output = _answer_text(answer) or "alpha bravo charlie"
    stops = _near_miss_stops(output, ph.size.stop_strings) if ph.is_attack else ["\x00END"]
    body = {**plain, "stop_sequences": stops}
    big = {**plain, "stop_sequences": ["\x01" * ph.size.stop_big_bytes] if ph.is_attack
           else ["\x01"]}
    requests = [post(c.ANTHROPIC_PATH, body) for _ in range(ph.size.stop_requests)]
    requests.append(post(c.ANTHROPIC_PATH, big))
    ph.result.extra["stop_body_kb"] = round(len(requests[0].body) / 1024, 1)
    async with ph.attacker(requests, concurrency=4):
        await ph.probe()


def _answer_text(answer: dict | None) -> str:
    if not answer or "content" not in answer:
        return ""
    return "".join(block.get("text", "") for block in answer["content"])


def _near_miss_stops(output: str, n: int) -> list[str]:
    """Stop strings that are prefixes of the expected output followed by a mismatch, padded
    long: a matcher that compares each against the growing text does the most work."""
    stops = []
    for i in range(n):
        cut = max(1, len(output) - (i % max(1, len(output))))
        stops.append(output[:cut] + chr(0x2400 + i % 64) + "~" * 150 + str(i))
    return stops


async def queue_flood(ph: Phase) -> None:
    """900 requests in flight (the server's max_queue is 256), then the victim's probe. The
    control sends the same 900 at the attacker's max_running."""
    n = ph.size.flood_requests
    requests = [post(c.ANTHROPIC_PATH, c.anthropic_body(prompt(ph.rng, f"flood {i}", 4),
                                                         max_tokens=4)) for i in range(n)]
    concurrency = n if ph.is_attack else TenantConfig(name="defaults").max_running
    async with ph.attacker(requests, concurrency=concurrency, settle_s=0.5):
        await ph.probe()


PIN_WORDS = (320, 160, 80, 40, 20, 10)


async def pins(ph: Phase) -> None:
    """The attacker pins distinct long system prompts (cache_control) up to its quota; then
    the victim's probe sends its own breakpoints: did they pin?"""
    requests = []
    for i in range(ph.size.pin_requests):
        n_words = PIN_WORDS[i % len(PIN_WORDS)]     # big ones, then small ones fill gaps
        system = [{"type": "text", "text": prompt(ph.rng, f"attacker system {i}", n_words)}]
        if ph.is_attack:
            system[0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
        requests.append(post(c.ANTHROPIC_PATH, c.anthropic_body("hi", system=system, max_tokens=1)))
    await ph.attack_to_end(requests, concurrency=4)
    ph.result.extra["attacker_pinned_tokens"] = await _pinned_tokens(ph, ATTACKER)
    rng = random.Random(5)

    def victim_body(i: int) -> dict:
        system = [{"type": "text", "text": prompt(rng, f"victim system {i}", 60),
                   "cache_control": {"type": "ephemeral"}}]
        return c.anthropic_body(f"question {i}", system=system, max_tokens=8)

    answers = await ph.probe(victim_body)
    created = [(a or {}).get("usage", {}).get("cache_creation_input_tokens", 0) for a in answers]
    ph.result.extra["victim_pinned"] = sum(1 for n in created if n and n > 0)
    ph.result.extra["victim_pinned_tokens"] = await _pinned_tokens(ph, VICTIM)


async def _pinned_tokens(ph: Phase, tenant: str) -> int | None:
    status, stats = await c.get_json(ph.session, ph.base + "/v1/cache/stats", ADMIN_KEY)
    return stats["tenants"].get(tenant, {}).get("pinned_tokens") if status == 200 else None


async def top_prefixes(ph: Phase) -> None:
    """The victim caches 3 prefixes; the attacker uses 30 prefixes 6 times each (the
    control: as many requests, all distinct); then the victim's /v1/cache/stats."""
    for i in range(3):
        system = prompt(random.Random(i), f"victim prefix {i}", 40)
        for j in range(2):
            await ph.victim_call(c.ANTHROPIC_PATH, c.anthropic_body(f"q{j}", system=system))
    before, _ = await _victim_prefix_count(ph)
    n, uses = ph.size.hot_prefixes, ph.size.hot_prefix_uses
    requests = []
    for i in range(n * uses):
        key = i % n if ph.is_attack else i
        system = prompt(random.Random(1000 + key), f"attacker prefix {key}", 40)
        requests.append(post(c.ANTHROPIC_PATH, c.anthropic_body(f"a{i}", system=system,
                                                                max_tokens=1)))
    await ph.attack_to_end(requests, concurrency=8)
    after, stats_ms = await _victim_prefix_count(ph)
    ph.result.extra.update(victim_prefixes_before=before, victim_prefixes_after=after,
                           victim_stats_ms=stats_ms)
    await ph.probe()


async def _victim_prefix_count(ph: Phase) -> tuple[int | None, float]:
    status, latency_s, stats = await ph.victim_call("/v1/cache/stats", None, method="GET")
    count = len(stats.get("top_prefixes", [])) if status == "200" and stats else None
    return count, _ms(latency_s)


async def salt_churn(ph: Phase) -> None:
    """N distinct cache_salt values on /v1/chat/completions (the control: no salt); then the
    victim's throughput over a short burst, its /v1/cache/stats latency and the probe."""
    rss_before = ph.rss_mb()
    requests = []
    for i in range(ph.size.salts):
        body = c.chat_body(f"churn {i} {c.words(ph.rng, 3)}", max_tokens=1)
        if ph.is_attack:
            body["cache_salt"] = f"salt-{i}"
        requests.append(post(c.CHAT_PATH, body))
    await ph.attack_to_end(requests, concurrency=16, budget_s=ph.size.salt_budget_s)
    await asyncio.sleep(0.5)
    ph.result.extra.update(rss_before_mb=rss_before, rss_after_mb=ph.rss_mb(),
                           salts_sent=sum(n for s, n in ph.result.attacker_statuses.items()
                                          if s != "not_sent"),
                           victim_burst_rps=await _victim_burst(ph),
                           victim_stats_ms=await _victim_stats_p50(ph))
    await ph.probe()


async def _victim_burst(ph: Phase) -> float:
    rng = random.Random(3)
    requests = [post(c.ANTHROPIC_PATH, c.anthropic_body(prompt(rng, f"burst {i}"), max_tokens=8),
                     tenant=VICTIM) for i in range(ph.size.burst_requests)]
    pool = RequestPool(ph.session, ph.base, requests, concurrency=4).start()
    await pool.join(REQUEST_TIMEOUT_S)
    wall_s = await pool.stop()
    ph.result.extra["victim_burst_statuses"] = dict(pool.outcomes)
    return round(pool.outcomes.get("200", 0) / max(wall_s, 1e-6), 1)


async def _victim_stats_p50(ph: Phase) -> float:
    latencies = []
    for _ in range(5):
        _, latency_s, _ = await ph.victim_call("/v1/cache/stats", None, method="GET")
        latencies.append(latency_s)
    return _ms(statistics.median(latencies))


async def slow_clients(ph: Phase) -> None:
    """50 connections sending a body at one byte per second and 20 streams never read (the
    control: the same requests sent at once and read)."""
    rng = random.Random(8)
    body = c.anthropic_body(prompt(rng, "slow", 20), max_tokens=8)
    stream = c.anthropic_body(prompt(rng, "stuck", 8), max_tokens=400, stream=True)
    n_slow, n_stuck = ph.size.slow_bodies, ph.size.stuck_streams
    if ph.is_attack:
        requests = ([SlowBody(body) for _ in range(n_slow)]
                    + [StuckStream(stream) for _ in range(n_stuck)])
    else:
        requests = [post(c.ANTHROPIC_PATH, body) for _ in range(n_slow)]
        requests += [post(c.ANTHROPIC_PATH, stream) for _ in range(n_stuck)]
    async with ph.attacker(requests, concurrency=n_slow + n_stuck, settle_s=1.0):
        started = time.monotonic()
        await ph.probe()
        await asyncio.sleep(max(0.0, ph.size.slow_hold_s - (time.monotonic() - started)))


def _raw_head(body: bytes, port: int) -> bytes:
    return (f"POST {c.ANTHROPIC_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"x-api-key: {tenant_key(ATTACKER)}\r\nanthropic-version: 2023-06-01\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode()


def _status_of(head: bytes) -> str:
    parts = head.split(b" ", 2)
    return parts[1].decode(errors="replace") if len(parts) > 1 and head.startswith(b"HTTP/") \
        else "no_response"


@dataclass
class SlowBody:
    """Headers, then the body one byte per second until the server answers or closes."""

    body: dict
    outcome: str | None = None

    async def send(self, session, base: str) -> str:
        data = json.dumps(self.body).encode()
        port = int(base.rsplit(":", 1)[1])
        self.outcome = "still_sending"            # if cancelled: the server kept waiting
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(_raw_head(data, port))
            for i in range(len(data)):
                writer.write(data[i:i + 1])
                await writer.drain()
                with contextlib.suppress(asyncio.TimeoutError):
                    head = await asyncio.wait_for(reader.read(64), 1.0)
                    return _status_of(head) if head else "closed"
            return "body_sent"
        except (ConnectionError, OSError):
            return "closed"
        finally:
            writer.close()


@dataclass
class StuckStream:
    """A streaming request on a socket with a tiny receive buffer that is never read; its
    outcome (``unread_<status>``) is peeked when the pool stops."""

    body: dict
    outcome: str | None = None

    async def send(self, session, base: str) -> str:
        data = json.dumps(self.body).encode()
        port = int(base.rsplit(":", 1)[1])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, _raw_head(data, port) + data)
            await asyncio.sleep(3600)
            return "held"
        except (ConnectionError, OSError):
            return "closed"
        except asyncio.CancelledError:
            self.outcome = _peek_status(sock)     # what RequestPool records for it
            raise
        finally:
            sock.close()


def _peek_status(sock: socket.socket) -> str:
    try:
        head = sock.recv(16, socket.MSG_PEEK)
    except (BlockingIOError, OSError):
        return "unread_no_response"
    return "unread_" + _status_of(head) if head else "closed"


ATTACKS: dict[str, Callable[[Phase], Awaitable[None]]] = {
    "sampling": sampling, "huge_messages": huge_messages, "stop_strings": stop_strings,
    "queue_flood": queue_flood, "pins": pins, "top_prefixes": top_prefixes,
    "salt_churn": salt_churn, "slow_clients": slow_clients,
}


# ---------------------------------------------------------------- driver

# top_prefixes: room for every prefix, so eviction does not hide the victim's.
SPEC_OF = {"top_prefixes": {"kv_cache_gb": 0.02}}


async def run_phase(attack: str, size: Size, is_attack: bool) -> PhaseResult:
    """A fresh server, one phase of ``attack``, the server's 5xx and logged errors."""
    server = ServerProcess(server_spec(**SPEC_OF.get(attack, {}))).start()
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            ph = Phase(server, session, size, is_attack)
            await ATTACKS[attack](ph)
        result = ph.result
    finally:
        server.stop()
    statuses = result.victim_statuses + result.attacker_statuses
    result.server_5xx = sum(n for s, n in statuses.items()
                            if s.isdigit() and int(s) >= 500 and int(s) not in OVERLOAD)
    result.server_log_errors = _log_error_count(server)
    return result


def _log_error_count(server: ServerProcess) -> int:
    text = server.log_path.read_text(errors="replace")
    return sum(1 for line in text.splitlines()
               if " ERROR " in line or line.startswith("Traceback"))


async def run_attack(attack: str, size: Size) -> dict:
    """Control then attack phase of ``attack``; the victim's latency ratios."""
    started = time.monotonic()
    control = (await run_phase(attack, size, is_attack=False)).summary()
    attacked = (await run_phase(attack, size, is_attack=True)).summary()
    return {"attack": attack, "control": control, "attack_phase": attacked,
            "ratio_p50": _ratio(attacked["victim_p50_ms"], control["victim_p50_ms"]),
            "ratio_max": _ratio(attacked["victim_max_ms"], control["victim_max_ms"]),
            "seconds": round(time.monotonic() - started, 1)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def markdown_table(results: list[dict]) -> str:
    rows = ["| attack | victim p50 ms ctrl/attack | max ms ctrl/attack | ratio p50 | ratio max "
            "| victim failed | attacker statuses (attack) | 5xx | notes |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ctl, att = r["control"], r["attack_phase"]
        statuses = " ".join(f"{k}:{v}" for k, v in sorted(att["attacker_statuses"].items()))
        rows.append(f"| {r['attack']} | {ctl['victim_p50_ms']} / {att['victim_p50_ms']} "
                    f"| {ctl['victim_max_ms']} / {att['victim_max_ms']} | {r['ratio_p50']} "
                    f"| {r['ratio_max']} | {att['victim_failed']} | {statuses} "
                    f"| {ctl['server_5xx'] + att['server_5xx']} | {_notes(ctl, att)} |")
    return "\n".join(rows)


_NOTE_KEYS = ("victim_pinned", "victim_pinned_tokens", "attacker_pinned_tokens", "victim_prefixes_before",
              "victim_prefixes_after", "victim_stats_ms", "victim_burst_rps", "rss_before_mb",
              "rss_after_mb", "salts_sent")


def _notes(control: dict, attack: dict) -> str:
    notes = [f"{k} {control[k]}/{attack[k]}" for k in _NOTE_KEYS if k in attack]
    notes.append(f"attacker {control['attacker_wall_s']}s/{attack['attacker_wall_s']}s")
    if attack["server_log_errors"]:
        notes.append(f"log errors {attack['server_log_errors']}")
    return "; ".join(notes)


def raise_fd_limit() -> None:
    """900 connections need fds on both sides; the server inherits this process's limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (~1-2 minutes)")
    ap.add_argument("--attacks", help=f"comma-separated subset of {','.join(ATTACKS)}")
    ap.add_argument("--out", help="write the JSON report to this file")
    args = ap.parse_args(argv)
    names = args.attacks.split(",") if args.attacks else list(ATTACKS)
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        ap.error(f"unknown attacks {unknown}; choose from {list(ATTACKS)}")
    size = QUICK if args.quick else Size()
    raise_fd_limit()
    started = time.monotonic()
    results = []
    for name in names:
        results.append(asyncio.run(run_attack(name, size)))
        print(f"{name}: ratio p50 {results[-1]['ratio_p50']} ({results[-1]['seconds']}s)",
              file=sys.stderr, flush=True)
    report = {"command": " ".join(sys.argv), "size": dataclasses.asdict(size),
              "seconds_total": round(time.monotonic() - started, 1), "attacks": results}
    print(markdown_table(results))
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
