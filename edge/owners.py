"""Who owns a stored response: a fingerprint of the API key that made it, when the server has keys.

Takes the request's (or WebSocket's) key headers; gives out the fingerprint the store keeps, never the key.
With keys set, a response made under one key is not found under another (docs/apis.md, "Background responses").
"""

from __future__ import annotations

import hashlib

from quart import has_websocket_context, request, websocket

from edge.guard import policy
from edge.keys import presented_key
from store.response_store import StoredResponse


def caller() -> str | None:
    """The fingerprint of the key this request presented; None when the server has no keys."""
    if not policy().keys:
        return None
    headers = websocket.headers if has_websocket_context() else request.headers
    presented = presented_key(headers.get("authorization"), headers.get("x-api-key"))
    return None if presented is None else hashlib.sha256(presented.encode()).hexdigest()


def visible(stored: StoredResponse) -> bool:
    """Whether this request may read `stored`: always without keys, else only under the key that made it."""
    return stored.owner is None or not policy().keys or stored.owner == caller()
