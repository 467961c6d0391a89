"""The chat page at `/`: static files shipped in the package (edge/web/), served with strict headers.

Nothing is built at install and nothing is rendered here: the page is a
fixed file, and all it shows comes from the API in the browser, where
model output is sanitized before it becomes HTML. Assets are named by a
hash of their content, so a page always loads the files it was written
with and they may be cached for good; the page itself is never cached.
The Content-Security-Policy allows only the server's own scripts and
styles, no inline script, and connections back to this origin alone.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources

import attrs
from quart import Blueprint, Response
from werkzeug.exceptions import NotFound

from edge.state import app_state

routes = Blueprint("web", __name__)

ASSET_PREFIX = "/assets/"
_ASSETS = {
    "chat.js": "text/javascript",
    "store.js": "text/javascript",
    "media.js": "text/javascript",
    "live.js": "text/javascript",
    "views.js": "text/javascript",
    "chat.css": "text/css",
    "vendor/marked.min.js": "text/javascript",
    "vendor/purify.min.js": "text/javascript",
    "vendor/highlight.min.js": "text/javascript",
    "vendor/github.min.css": "text/css",
    "vendor/github-dark.min.css": "text/css",
}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_COMMON = {"x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}


@attrs.frozen
class Asset:
    body: bytes
    content_type: str


@attrs.frozen
class Site:
    page: bytes
    # By hashed name (`chat.3f2a….js`), the name the page refers to.
    assets: dict[str, Asset]


@functools.cache
def site() -> Site:
    """The page with its asset references replaced by the hashed names, read once from the package."""
    files = resources.files("edge") / "web"
    page = (files / "index.html").read_text(encoding="utf-8")
    assets = {}
    for name, content_type in _ASSETS.items():
        body = (files / name).read_bytes()
        stem, _, suffix = name.rpartition(".")
        hashed = f"{stem}.{hashlib.sha256(body).hexdigest()[:16]}.{suffix}"
        assets[hashed] = Asset(body, content_type)
        page = page.replace(f'"{ASSET_PREFIX}{name}"', f'"{ASSET_PREFIX}{hashed}"')
    return Site(page=page.encode(), assets=assets)


def _enabled() -> None:
    if not app_state().running.settings.web:
        raise NotFound()


@routes.get("/")
async def page() -> Response:
    _enabled()
    headers = {**_COMMON, "content-security-policy": _CSP, "cache-control": "no-cache", "x-frame-options": "DENY"}
    return Response(site().page, content_type="text/html; charset=utf-8", headers=headers)


@routes.get("/assets/<path:name>")
async def asset(name: str) -> Response:
    _enabled()
    found = site().assets.get(name)
    if found is None:
        raise NotFound()
    headers = {**_COMMON, "cache-control": "public, max-age=31536000, immutable"}
    return Response(found.body, content_type=f"{found.content_type}; charset=utf-8", headers=headers)
