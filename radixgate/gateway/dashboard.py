"""GET /dashboard: the live cache dashboard, served from the package's own static files.

The page (``radixgate/gateway/static/``) is plain HTML, CSS and hand-written JavaScript modules; it
loads nothing from the network and polls ``GET /v1/cache/stats`` (docs/USAGE.md, Endpoints)
every 1.5 s with the API key from the browser's sessionStorage in an ``x-api-key`` header.

The page and its assets need no key (they hold no data), so an auth middleware must let
every path under ``DASHBOARD_PATH`` through; the stats endpoint does the access control.
Wire it from ``create_app``::

    add_dashboard_routes(app)
"""
from __future__ import annotations

from importlib import resources

from aiohttp import web

DASHBOARD_PATH = "/dashboard"

# file name -> content type: the only files served (no path is ever taken from the URL)
ASSETS = {
    "dashboard.html": "text/html",
    "dashboard.css": "text/css",
    "dashboard.js": "text/javascript",
    "format.js": "text/javascript",
    "charts.js": "text/javascript",
    "render.js": "text/javascript",
}

# Same-origin only: a stray external URL would fail to load instead of leaking a request.
# form-action 'none' means the key form can never be submitted into a URL.
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def add_dashboard_routes(app: web.Application) -> None:
    """Register GET /dashboard (the page) and GET /dashboard/{asset} (its CSS and JS)."""
    app.router.add_get(DASHBOARD_PATH, _page)
    app.router.add_get(DASHBOARD_PATH + "/", _redirect_to_page)
    app.router.add_get(DASHBOARD_PATH + "/{name}", _asset)


def read_asset(name: str) -> bytes:
    """Bytes of one packaged static file; KeyError for a name not in ASSETS."""
    if name not in ASSETS:
        raise KeyError(name)
    return resources.files("radixgate.gateway").joinpath("static", name).read_bytes()


def _response(name: str) -> web.Response:
    return web.Response(body=read_asset(name), content_type=ASSETS[name], charset="utf-8",
                        headers=_SECURITY_HEADERS)


async def _page(request: web.Request) -> web.Response:
    return _response("dashboard.html")


async def _redirect_to_page(request: web.Request) -> web.Response:
    raise web.HTTPFound(DASHBOARD_PATH)


async def _asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS or name == "dashboard.html":
        raise web.HTTPNotFound()
    return _response(name)
