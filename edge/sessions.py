"""The headers that name a conversation, as routers pass them on.

smg forwards an allow-list of headers that holds its own
`x-smg-routing-key` and not `x-session-affinity`; HAProxy and most proxies
forward `x-session-affinity` as sent. Either names the session when the
body's `prompt_cache_key` / `session_id` does not.
"""

from __future__ import annotations

from collections.abc import Callable

SESSION_HEADERS = ("x-session-affinity", "x-smg-routing-key")


def session_key(header: Callable[[str], str | None]) -> str | None:
    """The first session header present; `header` looks one up by name (`request.headers.get`)."""
    for name in SESSION_HEADERS:
        value = header(name)
        if value:
            return value
    return None
