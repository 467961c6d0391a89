"""`/v1/models`' card fields the chat page's models view reads: `ttl_left`, counted as the fleet's ttl check does."""

from __future__ import annotations

import time

from edge.model_cards import _status
from fleet.model_host import ModelHost, State
from fleet.spec import ModelSpec


def test_a_loaded_model_with_a_ttl_says_how_long_it_has_left() -> None:
    host = ModelHost(spec=ModelSpec(name="m", source="tiny", ttl=60.0), state=State.READY)
    host.last_used = time.monotonic() - 45
    left = _status(host)["ttl_left"]
    assert isinstance(left, float) and 14 <= left <= 15
    host.last_used = time.monotonic() - 90
    assert _status(host)["ttl_left"] == 0.0


def test_no_ttl_left_unloaded_pinned_or_without_a_ttl() -> None:
    specs = [ModelSpec(name="m", source="tiny", ttl=60.0, pinned=True), ModelSpec(name="m", source="tiny")]
    hosts = [ModelHost(spec=spec, state=State.READY) for spec in specs]
    hosts.append(ModelHost(spec=ModelSpec(name="m", source="tiny", ttl=60.0)))
    assert all("ttl_left" not in _status(host) for host in hosts)
