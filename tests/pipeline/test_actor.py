"""pipeline/actor.py: one item's failure fails its reply only; the actor keeps serving."""

from __future__ import annotations

import anyio
import attrs
import pytest
import structlog.testing

from pipeline.actor import call_isolated, isolated, isolated_task, serve_items
from pipeline.channels import Channel, ReplySlot, open_channel
from pipeline.errors import ErrorKind, RequestError, invalid


@attrs.frozen
class Item:
    name: str
    reply: ReplySlot[str]


class Bug(Exception):
    pass


async def handle(item: Item) -> None:
    if item.name == "bad-input":
        raise invalid("no good", param="x")
    if item.name == "bug":
        raise Bug("secret internals")
    if item.name == "recursion":
        raise RecursionError("maximum recursion depth exceeded")
    item.reply.accept(item.name)


async def serve(items: list[Item]) -> None:
    inbox: Channel[Item] = open_channel(len(items), name="items")
    for item in items:
        inbox.send.send_nowait(item)
    inbox.send.close()
    with anyio.fail_after(5):
        async with inbox.receive:
            await serve_items(inbox.receive, handle, stage="test")


async def failure(reply: ReplySlot[str]) -> RequestError:
    with pytest.raises(RequestError) as caught:
        await reply.accepted()
    return caught.value


async def test_each_item_fails_alone_and_the_next_is_served() -> None:
    """A 4xx stays the item's own; any other exception is a 500 with none of its text; later items are served."""
    items = [Item(name, ReplySlot(name, trace_id=f"t-{name}")) for name in ("bad-input", "bug", "recursion", "ok")]
    with structlog.testing.capture_logs() as logs:
        await serve(items)
    bad, bug, recursion, ok = items
    assert (await failure(bad.reply)).status == 400
    for item in (bug, recursion):
        error = await failure(item.reply)
        assert (error.kind, error.code) == (ErrorKind.INTERNAL, "internal_error")
        assert "secret" not in error.message and "recursion" not in error.message
    assert await ok.reply.accepted() == "ok"
    logged = [(e["event"], e["trace_id"], e["failed_stage"]) for e in logs if e["log_level"] == "error"]
    assert logged == [("request.internal_error", "t-bug", "test"), ("request.internal_error", "t-recursion", "test")]
    assert all("exc_info" in e for e in logs if e["log_level"] == "error")


async def test_an_item_whose_reply_is_done_is_skipped() -> None:
    """A reply that was closed (its client left) is not handled at all."""
    gone = Item("bug", ReplySlot("gone"))
    gone.reply.close()
    with structlog.testing.capture_logs() as logs:
        await serve([gone])
    assert logs == []


def test_the_actors_own_streams_failing_is_not_swallowed() -> None:
    """A broken channel is the actor's failure, not the item's: it propagates."""
    reply: ReplySlot[str] = ReplySlot("r")
    with pytest.raises(anyio.BrokenResourceError), isolated(reply, stage="test"):
        raise anyio.BrokenResourceError
    assert not reply.done


def test_a_failure_off_the_loop_is_delivered_through_fail() -> None:
    """The model thread hands the error over instead of touching the reply."""
    delivered: list[RequestError] = []
    reply: ReplySlot[str] = ReplySlot("r")
    with structlog.testing.capture_logs(), isolated(reply, stage="gateway", fail=delivered.append):
        raise KeyError("x")
    assert [error.code for error in delivered] == ["internal_error"] and not reply.done


def test_a_task_failure_is_logged_and_reported() -> None:
    """Work no request waits on (a spill) is logged with its stack and counted by the caller."""
    counted: list[str] = []
    with structlog.testing.capture_logs() as logs, isolated_task("spill", on_error=lambda: counted.append("x")):
        raise NotADirectoryError("kv")
    assert counted == ["x"]
    assert [(e["event"], e["task"]) for e in logs] == [("task.failed", "spill")]


def raising(error: BaseException) -> None:
    raise error


@pytest.mark.parametrize(
    "error", [invalid("no good", param="x"), Bug("secret internals")], ids=["request-error", "bug"]
)
async def test_a_call_isolated_fails_its_reply_as_the_context_manager_does(error: Exception) -> None:
    """The sink's per-token form: a request error fails the reply as it is, a bug as a logged 500."""
    reply: ReplySlot[str] = ReplySlot("r")
    with structlog.testing.capture_logs() as logs:
        call_isolated(reply, "sink", raising, error)
    failed = await failure(reply)
    if isinstance(error, RequestError):
        assert failed is error and logs == []
    else:
        assert failed.code == "internal_error" and "secret" not in failed.message
        assert [entry["event"] for entry in logs] == ["request.internal_error"]


def test_a_call_isolated_lets_the_actors_own_failure_through() -> None:
    reply: ReplySlot[str] = ReplySlot("r")
    with pytest.raises(anyio.ClosedResourceError):
        call_isolated(reply, "sink", raising, anyio.ClosedResourceError())
    assert not reply.done
