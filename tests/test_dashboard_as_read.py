"""The dashboard as a user reads it (issue 47): the hottest shared prefixes are not the
chat template's opening; the measured prefill rate is what a cold prompt really runs at;
the hit-rate line has gaps, not zeros, where no request came.

One server for the module with the default model (SmolLM2-135M, starts in seconds): the
tiny model's steps cost next to nothing, so it cannot show how a rate measured over many
small steps misreads a long prompt. Its traffic is its own (the other dashboard tests count
theirs exactly); the browser tests use headless Chromium like tests/test_dashboard_browser.py."""
from __future__ import annotations

import json
import os
import random
import time
import urllib.request

import pytest

from radixgate.gateway.cache_stats import template_headers
from tests.support.engine import tiny_model
from tests.support.server import ADMIN_KEY, ServerProcess, ServerSpec, tenant_key
from tests.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS, open_with_key

TENANT = "initech"
SPEC = ServerSpec(kv_cache_gb=0.1, max_model_len=2048, tenants=(TENANT,),
                  max_pinned_tokens=4096, tiny=False)
browser_test = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                  reason=f"chromium not installed at {CHROMIUM} "
                                         "(make browser-deps)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ServerProcess(SPEC, tmp_path_factory.mktemp("dashboard-read")).start()
    try:
        yield proc.base_url
    finally:
        proc.stop()


def ask(base_url: str, messages: list[dict], system: str | None = None) -> tuple[dict, float]:
    """One Anthropic request of TENANT, 1 answer token: (its usage, seconds it took)."""
    body = {"model": "claude-3-5-haiku-latest", "max_tokens": 1, "messages": messages}
    if system is not None:
        body["system"] = system
    req = urllib.request.Request(
        base_url + "/v1/messages", data=json.dumps(body).encode(), method="POST",
        headers={"x-api-key": tenant_key(TENANT), "content-type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        usage = json.load(resp)["usage"]
    return usage, time.perf_counter() - started


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(("alpha", "delta", "river", "stone", "cloud", "amber", "noon",
                                "quartz", "maple", "ember")) + str(rng.randrange(100))
                    for _ in range(n))


def fetch_stats(base_url: str) -> dict:
    req = urllib.request.Request(base_url + "/v1/cache/stats", headers={"x-api-key": ADMIN_KEY})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def test_hottest_prefixes_are_more_than_the_chat_templates_opening(server):
    """Every conversation shares the template's opening (``<|im_start|>system\\n``, or the
    default system prompt before a user's first text): those nodes get every hit, but the
    list shows only prefixes with at least a block of the clients' own text."""
    shared_system = words(60, seed=1)
    for i in range(3):
        ask(server, user(f"question {i}: " + words(8, seed=10 + i)), system=shared_system)
        ask(server, user(words(12, seed=20 + i)), system=words(30, seed=30 + i))
        ask(server, user(words(12, seed=40 + i)))           # no system: the default one
    stats = fetch_stats(server)
    headers = template_headers(tiny_model().tokenizer)
    assert sorted(map(len, headers)) == [3, 24]     # "<|im_start|>system\n"; + default prompt
    block = stats["block_size"]
    prefixes = stats["top_prefixes"]
    assert prefixes, "the repeated system prompt should be listed"
    for prefix in prefixes:
        shown = prefix["preview"]
        for header in headers:
            text = tiny_model().tokenizer.decode(list(header))
            if shown.startswith(text):
                assert prefix["tokens"] >= len(header) + block, prefix
    assert any(shared_system[:40] in p["preview"] for p in prefixes)


def chromium_page():
    from playwright.sync_api import sync_playwright
    manager = sync_playwright().start()
    browser = manager.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
    return manager, browser, page


@pytest.fixture
def page():
    manager, browser, page = chromium_page()
    try:
        yield page
    finally:
        browser.close()
        manager.stop()


@browser_test
def test_measured_prefill_rate_is_what_a_cold_prompt_runs_at(server, page):
    """A cold ~1,500-token prompt's tokens over its seconds end to end, against the rate
    the page shows after small requests (whose steps are mostly fixed cost: a mean of
    per-step rates read 40% of the cold prompt's here)."""
    usage, seconds = ask(server, user(words(500, seed=99)))
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"] + \
        usage["cache_creation_input_tokens"]
    assert usage["cache_read_input_tokens"] < 64 and prompt > 1200, usage
    for i in range(20):                                    # chat-sized turns after it
        ask(server, user(f"ok {i}"))
    open_with_key(page, server, ADMIN_KEY)
    shown = float(page.get_attribute('[data-stat="prefill_tokens_per_s"]', "data-value"))
    cold = prompt / seconds
    assert 0.5 * cold <= shown <= 2 * cold, (shown, cold)


@browser_test
def test_the_hit_rate_line_has_gaps_where_no_request_came(server, page):
    """Samples a minute apart are not joined (and never drawn at 0%): one subpath per run
    of samples, lone samples as dots."""
    open_with_key(page, server, ADMIN_KEY)
    drawn = page.evaluate("""async () => {
      const charts = await import('/dashboard/charts.js');
      const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
      svg.style.width = '640px'; svg.style.height = '300px';
      document.body.appendChild(svg);
      const p = (t, rate) => ({t, prompt: 100, read: 100 * rate, rate});
      const points = [p(0, 0.9), p(1, 0.8), p(2, 0.9), p(70, 0.95), p(140, 0.9), p(141, 0.85)];
      charts.drawHitChart(svg, points, 150);
      const line = svg.querySelector('#hit-line');
      const zero = Number(svg.querySelector('line[data-pct="0"]').getAttribute('y1'));
      const ys = [...line.getAttribute('d').matchAll(/[ML][\\d.]+,([\\d.]+)/g)].map(m => +m[1]);
      return {d: line.getAttribute('d'), zero, ys,
              dots: svg.querySelectorAll('circle.rate-dot').length};
    }""")
    assert drawn["d"].count("M") == 3, drawn          # runs: 0-2 s, 70 s, 140-141 s
    assert len(drawn["ys"]) == 6 and all(y < drawn["zero"] - 10 for y in drawn["ys"]), drawn
    assert drawn["dots"] == 6
