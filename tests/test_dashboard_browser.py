"""The dashboard in headless Chromium against a real ``radixgate serve --tiny``.

One server per module with an admin key and two tenant keys; a scripted workload with a
known hit pattern (tenant acmecorp sends the same long system prompt twice, globexinc one
unique prompt); then the page is opened with each key and every number it shows is checked
against GET /v1/cache/stats read with the same key once the workload is frozen.
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.server import ADMIN_KEY, ServerProcess, ServerSpec, tenant_key

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason=f"chromium not installed at {CHROMIUM} (make browser-deps)"),
]


ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
TENANTS = ("acmecorp", "globexinc")
SPEC = ServerSpec(kv_cache_gb=0.01, max_model_len=2048, tenants=TENANTS,
                  max_pinned_tokens=4096)
SYSTEM_PROMPT = " ".join(
    f"Rule {i}: answer questions about the radix tree cache precisely and briefly."
    for i in range(30))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ServerProcess(SPEC, tmp_path_factory.mktemp("dashboard")).start()
    try:
        run_workload(proc.base_url)
        wait_until_settled(proc.base_url)
        yield proc.base_url
    finally:
        proc.stop()


def run_workload(base_url: str) -> None:
    """acmecorp: one long system prompt (with a cache breakpoint) twice; globexinc: once, unique,
    written with a 1-hour TTL (priced at 2x on the page)."""
    def ask(tenant: str, system: str, question: str, ttl: str = "5m") -> None:
        cache_control = {"type": "ephemeral", "ttl": ttl}
        body = {"model": "claude-3-5-haiku-latest", "max_tokens": 4,
                "system": [{"type": "text", "text": system, "cache_control": cache_control}],
                "messages": [{"role": "user", "content": question}]}
        req = urllib.request.Request(
            base_url + "/v1/messages", data=json.dumps(body).encode(), method="POST",
            headers={"x-api-key": tenant_key(tenant), "content-type": "application/json",
                     "anthropic-version": "2023-06-01"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert json.load(resp)["type"] == "message"

    # a second apart, so each lands in its own per-second history sample: misses, hit, miss
    ask("acmecorp", SYSTEM_PROMPT, "What is a block?")
    time.sleep(1.05)
    ask("acmecorp", SYSTEM_PROMPT, "What is a node?")
    time.sleep(1.05)
    ask("globexinc", "You write haiku about the sea, nothing else.", "Tide?", ttl="1h")


def wait_until_settled(base_url: str, timeout_s: float = 30.0) -> None:
    """Until nothing runs or waits and two reads 0.5 s apart agree on the token counters."""
    deadline = time.monotonic() + timeout_s
    previous = None
    while time.monotonic() < deadline:
        stats = fetch_stats(base_url, ADMIN_KEY)
        busy = stats["requests"]["running"] or stats["requests"]["waiting"]
        if not busy and stats["tokens"] == previous:
            return
        previous = stats["tokens"]
        time.sleep(0.5)
    raise TimeoutError("stats did not settle after the workload")


class LocalModeServer(ServerProcess):
    """``radixgate serve --tiny`` with no config file: no API keys, loopback only."""

    def command(self) -> list[str]:
        cmd = super().command()
        at = cmd.index("--config")
        return cmd[:at] + cmd[at + 2:]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.requests_seen = []
    page.errors = []
    page.on("request", lambda r: page.requests_seen.append(r))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    context.close()


def fetch_stats(base_url: str, key: str | None) -> dict:
    headers = {"x-api-key": key} if key else {}
    req = urllib.request.Request(base_url + "/v1/cache/stats", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


BASE_PRICE_PER_MTOK = 3.0     # the page's default
GROUPS = {"tokens": ("prompt", "cache_read", "cache_creation", "uncached", "output"),
          "blocks": ("total", "free", "cached", "pinned", "in_use"),
          "tree": ("nodes", "cached_tokens", "evictable_tokens", "pinned_tokens"),
          "requests": ("running", "waiting", "finished", "errors"),
          "evictions": ("lru", "ttl", "flush")}


def expected_page_numbers(stats: dict) -> dict:
    """data-stat -> the value the page must show for this stats JSON (None: "n/a")."""
    out = {"hit_rate": stats["hit_rate"], "model": stats["model"],
           "block_size": stats["block_size"]}
    for group, keys in GROUPS.items():
        out.update({f"{group}.{key}": stats[group][key] for key in keys})
    for kind in ("hit", "miss"):
        for q in ("p50", "p95"):
            out[f"ttft_ms.{kind}.{q}"] = stats["ttft_ms"][kind][q]
    t = stats["tokens"]
    prompt, read, creation = t["prompt"], t["cache_read"], t["cache_creation"]
    out["tokens.computed"] = prompt - read
    rate = stats.get("prefill_tokens_per_s") or 0
    out["prefill_tokens_per_s"] = rate if rate > 0 else None
    out["prefill_saved_s"] = read / rate if rate > 0 else None
    # Anthropic-style prices: reads 0.1x, 5-minute writes 1.25x, 1-hour writes 2x of input
    out["tokens.cache_creation_1h"] = t.get("cache_creation_1h")     # optional in the JSON
    write_1h = min(t.get("cache_creation_1h", 0), creation)
    units = (read * 0.1 + (creation - write_1h) * 1.25 + write_1h * 2.0
             + max(0, prompt - read - creation))
    out["cost.relative"] = units / prompt if prompt else None
    out["cost.with_cache_usd"] = units * BASE_PRICE_PER_MTOK / 1e6
    out["cost.without_cache_usd"] = prompt * BASE_PRICE_PER_MTOK / 1e6
    out["cost.saved_usd"] = out["cost.without_cache_usd"] - out["cost.with_cache_usd"]
    tiers = stats["tiers"]
    out["tiers.memory.blocks"] = tiers["memory"]["blocks"]
    out["tiers.memory.hit_tokens"] = tiers["memory"]["hit_tokens"]
    for key in ("blocks", "hit_tokens", "loads", "writes"):        # "n/a" without a disk tier
        out[f"tiers.disk.{key}"] = tiers["disk"][key] if tiers["disk"]["enabled"] else None
    spec = stats["spec"]                                           # "n/a" before any draft
    out["spec.drafted"], out["spec.accepted"] = spec["drafted"], spec["accepted"]
    out["spec.acceptance_rate"] = spec["acceptance_rate"] if spec["drafted"] else None
    out["spec.tokens_per_step"] = spec["tokens_per_step"] if spec["verify_steps"] else None
    return out


def parse_display(text: str) -> tuple[float, float]:
    """A figure as the page prints it -> (value, size of its last displayed digit)."""
    if m := re.fullmatch(r"(\d+)h (\d+)m", text):
        return int(m[1]) * 3600 + int(m[2]) * 60, 60.0
    if m := re.fullmatch(r"(\d+)m (\d+)s", text):
        return int(m[1]) * 60 + int(m[2]), 1.0
    m = re.fullmatch(r"(-?)\$?([\d,]+)(?:\.(\d+))?\s*(%|ms|s|tok/s)?", text)
    assert m, f"unparseable figure {text!r}"
    decimals = m[3] or ""
    value = float(m[2].replace(",", "") + ("." + decimals if decimals else ""))
    resolution = 10.0 ** -len(decimals)
    value = -value if m[1] else value
    if m[4] == "%":
        return value / 100, resolution / 100
    return value, resolution


def wait_for_generation(page, at_least: int, timeout_s: float = 15.0) -> None:
    # polled from Python: the page's CSP forbids the eval that wait_for_function needs
    deadline = time.monotonic() + timeout_s
    while int(page.get_attribute("body", "data-generation") or 0) < at_least:
        assert time.monotonic() < deadline, f"page did not render {at_least} snapshots"
        page.wait_for_timeout(100)


def open_with_key(page, base_url: str, key: str) -> None:
    page.goto(base_url + "/dashboard")
    page.wait_for_selector("#key-dialog[open]")          # server has keys: stats said 401
    assert page.get_attribute("body", "data-state") == "auth"
    page.fill("#key-input", key)
    page.click("#key-submit")
    wait_for_generation(page, 1)


def displayed_numbers(page) -> dict[str, tuple[str, str]]:
    """data-stat -> (data-value, text) for every figure outside the per-row tables."""
    return page.evaluate("""() => Object.fromEntries(
        [...document.querySelectorAll('[data-stat]')]
          .filter(el => !el.closest('tr[data-tenant], tr[data-prefix-index]'))
          .map(el => [el.dataset.stat, [el.dataset.value ?? null, el.textContent.trim()]]))""")


def assert_numbers_match(shown: dict, expected: dict) -> None:
    assert set(expected) <= set(shown), f"page lacks {set(expected) - set(shown)}"
    for key, want in expected.items():
        value, text = shown[key]
        if want is None:   # TTFT percentiles without samples read "—", other unknowns "n/a"
            assert (value, text) == ("", "—" if key.startswith("ttft_ms.") else "n/a"), key
        elif isinstance(want, str):
            assert value == want and text == want, key
        else:
            assert float(value) == pytest.approx(want, rel=1e-9, abs=1e-12), key
            number, resolution = parse_display(text)
            assert abs(number - want) <= resolution / 2 + 1e-9, f"{key}: {text!r} vs {want}"


def assert_tenant_rows_match(page, stats: dict) -> None:
    rows = page.eval_on_selector_all("#tenants tr[data-tenant]", "rows => rows.map(r => [r.dataset.tenant, Object.fromEntries([...r.querySelectorAll('[data-stat]')].map(c => [c.dataset.stat, Number(c.dataset.value)]))])")
    assert sorted(name for name, _ in rows) == sorted(stats["tenants"])
    for name, cells in rows:
        info = stats["tenants"][name]
        assert cells["hit_rate"] == pytest.approx(info["hit_rate"], rel=1e-9)
        assert cells["tokens.prompt"] == info["tokens"]["prompt"]
        assert cells["tokens.cache_read"] == info["tokens"]["cache_read"]
        assert cells["pinned_tokens"] == info["pinned_tokens"]
        assert cells["running"] == info["running"]


def assert_prefix_rows_match(page, stats: dict) -> None:
    rows = page.eval_on_selector_all("#prefixes tr[data-prefix-index]", "rows => rows.map(r => Object.fromEntries([...r.querySelectorAll('[data-stat]')].map(c => [c.dataset.stat, c.dataset.value ?? c.textContent])))")
    assert len(rows) == len(stats["top_prefixes"])
    for row, prefix in zip(rows, stats["top_prefixes"]):
        assert int(row["tokens"]) == prefix["tokens"] and int(row["hits"]) == prefix["hits"]
        assert row["tenant"] == prefix["tenant"]
        assert abs(float(row["pin_ttl_s"]) - max(0.0, prefix["pin_ttl_s"])) < 10
        assert row.get("preview") == prefix.get("preview")


def assert_chart_draws_history(page, stats: dict) -> None:
    """The line's vertices, read back through the 0% and 100% gridlines, are the hit rates."""
    rates = [h["cache_read"] / h["prompt"] for h in stats["history"] if h["prompt"] > 0]
    assert rates, "the workload should leave samples with prompt tokens in history"
    line = page.query_selector("#hit-chart path#hit-line")
    assert line is not None, "no hit-rate line drawn"
    assert int(line.get_attribute("data-points")) == len(rates)
    vertices = [float(y) for y in re.findall(r"[ML][\d.]+,([\d.]+)", line.get_attribute("d"))]
    y0 = float(page.get_attribute('#hit-chart line[data-pct="0"]', "y1"))
    y100 = float(page.get_attribute('#hit-chart line[data-pct="100"]', "y1"))
    assert y0 - y100 > 50, "chart too small to read"
    drawn = [(y0 - y) / (y0 - y100) for y in vertices]
    assert drawn == pytest.approx(rates, abs=0.01)


def chart_geometry(page) -> dict:
    """The hit-rate chart as drawn: gridline heights by value, every text with its height,
    and each sample's bar pair (the rects' top and bottom edges)."""
    return page.evaluate("""() => {
      const svg = document.getElementById('hit-chart');
      const n = (el, a) => Number(el.getAttribute(a));
      const edges = (r) => r ? [n(r, 'y'), n(r, 'y') + n(r, 'height')] : null;
      return {
        pct: Object.fromEntries([...svg.querySelectorAll('line[data-pct]')]
          .map(l => [l.dataset.pct, n(l, 'y1')])),
        tokens: [...svg.querySelectorAll('line[data-tokens]')]
          .map(l => [Number(l.dataset.tokens), n(l, 'y1')]),
        texts: [...svg.querySelectorAll('text')].map(t => [t.textContent.trim(), n(t, 'y')]),
        bars: [...svg.querySelectorAll('rect.bar')].map(r => [r.classList.contains('read')
          ? 'read' : 'computed', n(r, 'y'), n(r, 'y') + n(r, 'height')]),
        pairs: [...svg.querySelectorAll('g.bar-pair')].map(g => ({
          t: Number(g.dataset.t), read: edges(g.querySelector('rect.read')),
          computed: edges(g.querySelector('rect.computed'))})),
      };
    }""")


def token_count(label: str) -> float:
    """An axis label such as "500", "1.5k" or "2M" as a number."""
    m = re.fullmatch(r"([\d.]+)([kM]?)", label)
    assert m, f"unreadable token axis label {label!r}"
    return float(m[1]) * {"": 1, "k": 1e3, "M": 1e6}[m[2]]


def label_at(texts: list, y: float) -> list[str]:
    """The texts drawn level with height ``y`` (a tick's label)."""
    return [text for text, ty in texts if abs(ty - 4 - y) <= 2]


def assert_token_bars_have_their_own_axis(page, stats: dict) -> None:
    """The token bars sit in a panel of their own under the hit-rate plot: its own labelled
    axis whose 0 line they stand on, nothing of them inside or just under the hit-rate
    plot's 0..100% range, and each bar's height read back through that axis is the
    sample's prompt tokens (from cache: the lower part)."""
    g = chart_geometry(page)
    y0, y100 = g["pct"]["0"], g["pct"]["100"]
    for pct, y in (("0%", y0), ("50%", g["pct"]["50"]), ("100%", y100)):
        assert pct in label_at(g["texts"], y), f"hit-rate axis lacks its {pct} label"
    ticks = dict(g["tokens"])
    assert 0 in ticks and len(ticks) >= 2, f"the token bars have no axis of their own: {ticks}"
    top = max(ticks)
    zero_y, top_y = ticks[0], ticks[top]
    assert zero_y - top_y > 30, "tokens panel too small to read"
    for value, y in ticks.items():
        labels = label_at(g["texts"], y)
        assert labels and token_count(labels[0]) == value, f"tick {value} labelled {labels}"
    assert top_y > y0 + 8, "the tokens panel overlaps the hit-rate plot"
    titles = {text: y for text, y in g["texts"] if "hit rate" in text or "tokens" in text}
    assert any("hit rate" in t and y < y100 for t, y in titles.items()), titles
    assert any("tokens" in t and y0 < y < top_y for t, y in titles.items()), titles
    for kind, y_top, y_bottom in g["bars"]:
        assert top_y - 0.2 <= y_top <= y_bottom <= zero_y + 0.2, (kind, y_top, y_bottom)
    samples = [h for h in stats["history"] if h["prompt"] > 0]
    assert [p["t"] for p in g["pairs"]] == [h["t"] for h in samples]
    scale = top / (zero_y - top_y)                   # tokens per unit of height
    tolerance = 0.15 * scale + 1e-9                  # coordinates are drawn to 0.1
    for pair, sample in zip(g["pairs"], samples):
        (read_top, read_bottom), (all_top, all_bottom) = pair["read"], pair["computed"]
        assert read_bottom == pytest.approx(zero_y, abs=0.15)
        assert all_bottom == pytest.approx(read_top, abs=0.15)
        assert abs((zero_y - all_top) * scale - sample["prompt"]) <= tolerance, (pair, sample)
        assert abs((zero_y - read_top) * scale - sample["cache_read"]) <= tolerance, (pair, sample)


def test_admin_page_shows_server_stats_and_keeps_key_out_of_urls(server, page):
    open_with_key(page, server, ADMIN_KEY)
    stats = fetch_stats(server, ADMIN_KEY)
    assert 0 < stats["tokens"]["cache_creation_1h"] < stats["tokens"]["cache_creation"]
    assert_numbers_match(displayed_numbers(page), expected_page_numbers(stats))
    assert_tenant_rows_match(page, stats)
    assert_prefix_rows_match(page, stats)
    assert_chart_draws_history(page, stats)
    assert page.evaluate("sessionStorage.getItem('radixgate.api_key')") == ADMIN_KEY
    assert all(ADMIN_KEY not in r.url for r in page.requests_seen)
    stats_requests = [r for r in page.requests_seen if r.url.endswith("/v1/cache/stats")]
    assert stats_requests[-1].headers.get("x-api-key") == ADMIN_KEY
    assert not page.errors
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)


def test_chart_draws_token_bars_on_their_own_labelled_axis(server, page):
    open_with_key(page, server, ADMIN_KEY)
    stats = fetch_stats(server, ADMIN_KEY)
    assert_chart_draws_history(page, stats)
    assert_token_bars_have_their_own_axis(page, stats)
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#hit-chart").screenshot(path=str(ARTIFACTS / "hit-chart.png"))


def test_known_hit_pattern_shows_hits_for_repeated_prompt_only(server, page):
    open_with_key(page, server, ADMIN_KEY)
    acme = page.get_attribute('#tenants tr[data-tenant="acmecorp"] [data-stat="hit_rate"]',
                              "data-value")
    globex = page.get_attribute('#tenants tr[data-tenant="globexinc"] [data-stat="hit_rate"]',
                                "data-value")
    assert float(acme) > 0.3       # second request reads the long system prompt from cache
    assert float(globex) == 0.0    # one unique prompt: nothing to hit
    history = fetch_stats(server, ADMIN_KEY)["history"]
    rates = [h["cache_read"] / h["prompt"] for h in history if h["prompt"]]
    assert len(rates) == 3 and rates[0] == 0 and rates[1] > 0.9 and rates[2] == 0
    assert page.get_attribute("#hit-line", "data-points") == "3"
    # the server's per-tenant history draws acmecorp's miss-then-hit line on the first render
    assert page.query_selector('#tenants tr[data-tenant="acmecorp"] svg path.spark') is not None


def test_base_price_input_reprices_the_savings(server, page):
    open_with_key(page, server, ADMIN_KEY)
    page.fill("#base-price", "15")
    stats = fetch_stats(server, ADMIN_KEY)
    at_3 = expected_page_numbers(stats)
    shown = displayed_numbers(page)
    for key in ("cost.with_cache_usd", "cost.without_cache_usd", "cost.saved_usd"):
        assert float(shown[key][0]) == pytest.approx(at_3[key] * 5, rel=1e-9), key
    assert float(shown["cost.relative"][0]) == pytest.approx(at_3["cost.relative"], rel=1e-9)
    assert float(shown["cost.saved_usd"][0]) > 0


def test_tenant_key_sees_only_its_own_tenant(server, page):
    open_with_key(page, server, tenant_key("acmecorp"))
    stats = fetch_stats(server, tenant_key("acmecorp"))
    assert list(stats["tenants"]) == ["acmecorp"]
    assert stats["prefill_tokens_per_s"] > 0              # so "prefill time saved" is shown
    assert_numbers_match(displayed_numbers(page), expected_page_numbers(stats))
    assert_tenant_rows_match(page, stats)
    assert_prefix_rows_match(page, stats)
    html = page.content()
    assert "globexinc" not in html and "globex" not in html.lower()
    assert "acmecorp" in html
    admin_previews = [p.get("preview") for p in fetch_stats(server, ADMIN_KEY)["top_prefixes"]]
    for preview in filter(None, admin_previews):
        assert preview not in page.inner_text("body")
    assert page.evaluate("sessionStorage.getItem('radixgate.api_key')") == tenant_key("acmecorp")


def test_percentiles_without_samples_show_a_dash(server, page):
    open_with_key(page, server, tenant_key("globexinc"))      # one miss, never a hit
    stats = fetch_stats(server, tenant_key("globexinc"))
    assert stats["ttft_ms"]["hit"] == {"p50": None, "p95": None}
    assert stats["ttft_ms"]["miss"]["p50"] > 0
    assert_numbers_match(displayed_numbers(page), expected_page_numbers(stats))
    assert page.inner_text('[data-stat="ttft_ms.hit.p50"]') == "—"


def test_rejected_key_keeps_the_prompt_open(server, page):
    page.goto(server + "/dashboard")
    page.wait_for_selector("#key-dialog[open]")
    page.fill("#key-input", "sk-not-a-key")
    page.click("#key-submit")
    page.wait_for_selector("#key-dialog[open]")
    deadline = time.monotonic() + 10
    while "rejected" not in page.inner_text("#key-reason"):
        assert time.monotonic() < deadline
        page.wait_for_timeout(100)
    assert page.get_attribute("body", "data-generation") is None
    assert "sk-not-a-key" not in page.url


@pytest.mark.slow   # a second server start (10-30 s on 2 busy cores)
def test_local_mode_needs_no_key(tmp_path, page):
    proc = LocalModeServer(SPEC, tmp_path).start()
    try:
        page.goto(proc.base_url + "/dashboard")
        wait_for_generation(page, 1)
        assert page.get_attribute("#key-dialog", "open") is None
        assert page.evaluate("sessionStorage.getItem('radixgate.api_key')") is None
        stats = fetch_stats(proc.base_url, None)
        assert_numbers_match(displayed_numbers(page), expected_page_numbers(stats))
        assert page.is_visible("#chart-empty")     # no traffic yet: says so instead of a line
        stats_requests = [r for r in page.requests_seen if r.url.endswith("/v1/cache/stats")]
        assert stats_requests and "x-api-key" not in stats_requests[0].headers
    finally:
        proc.stop()


def create_explicit_cache(base_url: str, tenant: str) -> str:
    """A Gemini explicit cache of ``tenant`` (the last test: it adds traffic to the stats)."""
    body = {"model": "models/gemini-2.5-flash", "ttl": "600s", "displayName": "handbook",
            "systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]},
            "contents": [{"role": "user", "parts": [{"text": "The handbook follows."}]}]}
    req = urllib.request.Request(
        base_url + "/v1beta/cachedContents", data=json.dumps(body).encode(), method="POST",
        headers={"x-goog-api-key": tenant_key(tenant), "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)["name"]


def test_reasons_chart_and_explicit_caches_for_the_callers_tenant(server, page):
    """Why each request read what it read, per minute, and the tenant's explicit caches; a
    tenant sees its own only (kept last: the cache it creates is traffic of its own)."""
    name = create_explicit_cache(server, "acmecorp")
    wait_until_settled(server)
    open_with_key(page, server, tenant_key("acmecorp"))
    stats = fetch_stats(server, tenant_key("acmecorp"))
    totals = {r: sum(m[r] for m in stats["miss_reasons"])
              for r in ("hit", "new_content", "expired", "evicted", "first")}
    assert totals["first"] >= 1 and totals["new_content"] >= 1        # its repeated prompt
    for reason, count in totals.items():
        shown = page.get_attribute(f'[data-reason-total="{reason}"]', "data-value")
        assert int(shown) == count, reason
    assert page.locator("#reason-chart rect.reason").count() >= 2
    assert page.locator(f'#explicit-caches tr[data-cache="{name}"]').count() == 1
    assert "handbook" in page.inner_text("#explicit-caches")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-reasons.png"), full_page=True)
    page.evaluate("sessionStorage.clear()")               # another key: the prompt again
    open_with_key(page, server, tenant_key("globexinc"))
    assert page.locator("#explicit-caches tbody tr").count() == 0
    assert name not in page.content() and not page.errors
