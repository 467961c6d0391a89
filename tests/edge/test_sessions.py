"""The session headers routers forward (edge/sessions.py)."""

from __future__ import annotations

import pytest

from edge.sessions import session_key


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-session-affinity": "a"}, "a"),
        ({"x-smg-routing-key": "b"}, "b"),
        ({"x-session-affinity": "a", "x-smg-routing-key": "b"}, "a"),
        ({"x-session-affinity": "", "x-smg-routing-key": "b"}, "b"),
        ({"x-other": "c"}, None),
    ],
    ids=["haproxy-header", "smg-header", "both", "empty-first", "neither"],
)
def test_the_first_session_header_present_names_the_session(headers: dict[str, str], expected: str | None) -> None:
    assert session_key(headers.get) == expected
