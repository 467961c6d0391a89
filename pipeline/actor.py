"""The actor base: each item an actor handles is isolated from the others.

The rule (DESIGN.md, concurrency rules): whatever goes wrong while an actor
handles one request's item fails that request alone, and the actor takes
its next item.

- A `RequestError` is the request's own fault (or a limit it met): its
  reply fails with it, in the API's shape (4xx).
- Any other `Exception` is our bug met on this request's data: it is
  logged once, with the stack and the trace id, and the reply fails with
  500 `internal_error`; nothing of the exception reaches the client.
- What is not per item still propagates and ends the actor: cancellation
  (a `BaseException`), and the actor's own streams failing. Of the
  actors' work, only the gateway's model thread (MLX itself) is not split
  into items, so only it can mark the engine dead through the supervisor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar

import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from pipeline.channels import ReplySlot
from pipeline.errors import RequestError, internal_error

log = structlog.get_logger(stage="actor")

# The actor's own plumbing failing is the actor's failure, not the item's.
_ACTOR_FAILURES = (anyio.BrokenResourceError, anyio.ClosedResourceError)


class Item(Protocol):
    """A message that carries its request's reply slot."""

    @property
    def reply(self) -> ReplySlot[Any]: ...


ItemT = TypeVar("ItemT", bound=Item)
T = TypeVar("T")


@contextlib.contextmanager
def isolated(
    reply: ReplySlot[Any], *, stage: str, fail: Callable[[RequestError], object] | None = None
) -> Iterator[None]:
    """Run one item's work so that its failure fails `reply` and nothing else.

    `fail` delivers the error instead of `reply.fail`, for work off the
    event loop (the model thread hands it over at its next crossing).
    """
    deliver = reply.fail if fail is None else fail
    try:
        yield
    except _ACTOR_FAILURES:
        raise
    except RequestError as error:
        deliver(error)
    except Exception as error:  # the isolation boundary itself (logged, so a blind except is allowed)
        log.error("request.internal_error", **reply.log_context, failed_stage=stage, exc_info=error)
        deliver(internal_error())


def call_isolated(reply: ReplySlot[Any], stage: str, work: Callable[..., object], *args: object) -> None:
    """`work(*args)` under `isolated`'s rule, without a context manager's cost: for per-token work (the sink)."""
    try:
        work(*args)
    except _ACTOR_FAILURES:
        raise
    except RequestError as error:
        reply.fail(error)
    except Exception as error:  # the isolation boundary itself (logged, so a blind except is allowed)
        log.error("request.internal_error", **reply.log_context, failed_stage=stage, exc_info=error)
        reply.fail(internal_error())


@contextlib.contextmanager
def isolated_task(name: str, *, on_error: Callable[[], None] = lambda: None) -> Iterator[None]:
    """`isolated` for work no request waits on (a cache spill): logged with its stack, then `on_error`."""
    try:
        yield
    except _ACTOR_FAILURES:
        raise
    except Exception as error:  # the isolation boundary itself (logged, so a blind except is allowed)
        log.error("task.failed", task=name, exc_info=error)
        on_error()


async def serve_items(
    inbox: MemoryObjectReceiveStream[ItemT], handle: Callable[[ItemT], Awaitable[None]], *, stage: str
) -> None:
    """An actor's loop: each item is skipped once its reader left, else handled in isolation."""
    async for item in inbox:
        if item.reply.done:
            continue
        with isolated(item.reply, stage=stage):
            await handle(item)
