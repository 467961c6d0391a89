"""pipeline/ is backend-neutral: every async test here runs on asyncio and on trio.

On trio the clock is `MockClock(autojump_threshold=0)`, so timeouts elapse
as soon as every task is blocked and timeout tests take no real time.
"""

from __future__ import annotations

import pytest
import trio.testing


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    if request.param == "trio":
        return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})
    return "asyncio"
