"""GET /dashboard serves a self-contained page: every asset from the package, no network URL.

Fast (no model, no browser): the routes are mounted on a bare aiohttp app.
"""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from aiohttp import web

from radixgate.gateway.dashboard import ASSETS, DASHBOARD_PATH, add_dashboard_routes

EXTERNAL_URL = re.compile(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}", re.IGNORECASE)
JS_IMPORT = re.compile(r"""^\s*import\b[^'"]*['"]([^'"]+)['"]""", re.MULTILINE)


class _RefCollector(HTMLParser):
    """Collects every src/href/action attribute and the attributes of <input> and <form>."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.inputs: list[dict[str, str | None]] = []
        self.forms: list[dict[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.refs += [v for k, v in attrs if k in ("src", "href", "action") and v]
        if tag == "input":
            self.inputs.append(attributes)
        if tag == "form":
            self.forms.append(attributes)


@pytest.fixture
async def client(aiohttp_client):
    app = web.Application()
    add_dashboard_routes(app)
    return await aiohttp_client(app)


def _parse(html: str) -> _RefCollector:
    collector = _RefCollector()
    collector.feed(html)
    return collector


def _resolve(ref: str, base_dir: str) -> str:
    """URL path of a relative reference made from a page or module living in base_dir."""
    ref = ref.removeprefix("./")
    return ref if ref.startswith("/") else f"{base_dir}/{ref}".replace("//", "/")


async def test_dashboard_returns_html_with_no_external_urls(client):
    resp = await client.get(DASHBOARD_PATH)
    assert resp.status == 200
    assert resp.content_type == "text/html"
    html = await resp.text()
    assert "<svg" in html and 'id="hit-chart"' in html
    refs = _parse(html).refs
    assert refs, "the page should reference its stylesheet and script"
    for ref in refs:
        assert not ref.lower().startswith(("http:", "https:", "//")), ref
    assert not EXTERNAL_URL.search(html)


async def test_every_asset_the_page_and_its_modules_reference_is_served_locally(client):
    html = await (await client.get(DASHBOARD_PATH)).text()
    pending = [_resolve(r, "") for r in _parse(html).refs if not r.startswith("data:")]
    seen: set[str] = set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        resp = await client.get(path)
        assert resp.status == 200, path
        body = await resp.text()
        assert not EXTERNAL_URL.search(body), f"{path} names an external URL"
        if path.endswith(".js"):
            assert resp.content_type == "text/javascript"
            directory = path.rsplit("/", 1)[0]
            pending += [_resolve(m, directory) for m in JS_IMPORT.findall(body)]
    served = {f"{DASHBOARD_PATH}/{name}" for name in ASSETS if name != "dashboard.html"}
    assert seen == served, "every packaged asset is used and nothing else is fetched"


async def test_dashboard_csp_allows_only_same_origin_and_no_form_submission(client):
    resp = await client.get(DASHBOARD_PATH)
    csp = resp.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp
    assert "connect-src 'self'" in csp and "script-src 'self'" in csp
    assert "form-action 'none'" in csp
    assert resp.headers["Referrer-Policy"] == "no-referrer"


async def test_key_input_can_never_be_submitted_into_a_url(client):
    page = _parse(await (await client.get(DASHBOARD_PATH)).text())
    key_inputs = [i for i in page.inputs if i.get("id") == "key-input"]
    assert len(key_inputs) == 1
    assert key_inputs[0].get("type") == "password"
    assert "name" not in key_inputs[0], "a named input would be serialised into a GET URL"
    assert all((f.get("method") or "get").lower() != "get" for f in page.forms)


async def test_unknown_asset_names_and_path_tricks_are_not_found(client):
    for path in ("/dashboard/nope.js", "/dashboard/..%2Fdashboard.py", "/dashboard/dashboard.html"):
        resp = await client.get(path)
        assert resp.status == 404, path


async def test_trailing_slash_redirects_to_the_page(client):
    resp = await client.get(DASHBOARD_PATH + "/", allow_redirects=False)
    assert resp.status == 302
    assert resp.headers["Location"] == DASHBOARD_PATH
