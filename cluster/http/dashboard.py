"""The dashboard: `GET /` (the page) and its static assets under `/ui/...`.

What it owns: serving the files of `cluster/http/ui/` (plain HTML, CSS and JavaScript, no build
step, nothing loaded from another site) with cache headers. The page itself talks to the same
node's `/v1` API from the browser, with the bearer token the person typed; this module holds no
data and needs no token (the middleware leaves "/" and "/ui/..." open).

Caching: the assets are read once, at import, and named in the page with a content hash
(`/ui/app.js?v=<hash>`), so a browser may keep them for a year (`immutable`) and still picks up
a new version at once; the page itself is `no-cache` (revalidated every time, with an ETag).
A request for an asset with a stale or missing `?v=` is answered with `no-cache` too.

What it must not do: read the replicated state, or serve any file that is not in `ui/`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

UI_DIR = Path(__file__).with_name("ui")
ASSET_TYPES = {
    ".css": "text/css",
    ".js": "text/javascript",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
# The page loads nothing from elsewhere, except that it asks other members' /v1/cluster for
# their applied index (their http_address may be any host), so connect-src stays open.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self' http: https:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    version: str  # a short hash of the content: the `?v=` the page asks for, and the ETag

    @property
    def etag(self) -> str:
        return f'"{self.version}"'


def _load_assets() -> dict[str, Asset]:
    assets = {}
    for path in sorted(UI_DIR.iterdir()):
        content_type = ASSET_TYPES.get(path.suffix)
        if content_type is None or not path.is_file():
            continue
        body = path.read_bytes()
        assets[path.name] = Asset(body, content_type, hashlib.sha256(body).hexdigest()[:16])
    return assets


def _render_page(assets: dict[str, Asset]) -> Asset:
    """index.html with each `{{asset:NAME}}` replaced by the asset's versioned URL."""

    def versioned(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in assets:
            raise RuntimeError(f"index.html names {name!r}, which cluster/http/ui/ does not have")
        return f"/ui/{name}?v={assets[name].version}"

    text = re.sub(r"\{\{asset:([\w.-]+)\}\}", versioned, (UI_DIR / "index.html").read_text("utf-8"))
    body = text.encode("utf-8")
    return Asset(body, "text/html", hashlib.sha256(body).hexdigest()[:16])


ASSETS = _load_assets()
PAGE = _render_page(ASSETS)


def _answer(request: web.Request, asset: Asset, cache_control: str) -> web.Response:
    headers = {"Cache-Control": cache_control, "ETag": asset.etag, **SECURITY_HEADERS}
    if asset.etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    return web.Response(
        body=asset.body, content_type=asset.content_type, charset="utf-8", headers=headers
    )


async def page(request: web.Request) -> web.Response:
    return _answer(request, PAGE, REVALIDATE)


async def asset(request: web.Request) -> web.Response:
    found = ASSETS.get(request.match_info["name"])
    if found is None:
        raise web.HTTPNotFound()
    current = request.query.get("v") == found.version
    return _answer(request, found, IMMUTABLE if current else REVALIDATE)


def routes() -> list[web.RouteDef]:
    return [
        web.get("/", page),
        web.get("/ui/{name}", asset),
    ]
