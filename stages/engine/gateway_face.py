"""What the engine asks of a generation gateway, whichever side of a process boundary the model runs on.

The in-process `GenerationGateway` (stages/model_thread/gateway.py) and the `RemoteGateway` that drives a model
worker (stages/remote/chat_gateway.py) both answer it, so the engine holds one `Gateway` and never asks which it has
(issue #38); stages/engine/wiring.py chooses which, once, as it builds the engine's actors. Structural: neither
imports this module.
"""

from __future__ import annotations

from typing import Protocol

from anyio.abc import TaskStatus

from stages.cache.prompt import PromptCacheStatistics
from stages.model_thread.gateway import GatewayStatistics
from stages.remote.status import WorkerStatus


class Gateway(Protocol):
    async def run(self, *, task_status: TaskStatus[None] = ...) -> None:
        """Serves rows until its inbox closes; started once the model is loaded."""

    def statistics(self) -> GatewayStatistics: ...

    def cache_statistics(self) -> PromptCacheStatistics | None: ...

    def status(self) -> WorkerStatus | None:
        """The model worker's state; None where the model runs in this process."""

    async def refresh(self) -> None:
        """Returns once `statistics` covers every step delivered so far (at once where they are read in process)."""
