"""Remote MCP tools in Responses: a real FastMCP server on loopback, the tiny model forced to call it.

The random model's words are not asserted, only the items' shapes and the loop's course: the forced
call reaches the real server, whose deterministic answer comes back in the `mcp_call` item.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import openai
import pytest
import uvicorn
from mcp.server.fastmcp import FastMCP
from openai.types.responses import ResponseStreamEvent
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall, McpListTools
from pydantic import TypeAdapter
from starlette.applications import Starlette

from tests.conftest import Server, ServerFactory

pytestmark = pytest.mark.slow


def _mcp_app() -> Starlette:
    tools = FastMCP("calc", stateless_http=True)

    @tools.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return f"sum={a + b}"

    @tools.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        return f"echo:{text}"

    @tools.tool()
    def flip(side: Literal["heads", "tails"]) -> str:
        """Call a coin's side."""
        return f"called:{side}"

    http, sse = tools.streamable_http_app(), tools.sse_app()
    return Starlette(routes=[*http.routes, *sse.routes], lifespan=http.router.lifespan_context)


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_mcp_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the MCP server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def relay(server_factory: ServerFactory) -> Server:
    return server_factory(mcp_allow="http://127.0.0.1:")


def _tool(url: str, **extra: Any) -> Any:
    return {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never", **extra}


def _forced(name: str) -> Any:
    return {"type": "mcp", "server_label": "calc", "name": name}


def test_lists_calls_and_answers(relay: Server, mcp_url: str) -> None:
    client = relay.client()
    tool = _tool(f"{mcp_url}/mcp", allowed_tools=["add"], headers={"X-Secret": "s3cret"})
    response = client.responses.create(
        model="tiny", input="add", tools=[tool], tool_choice=_forced("add"), max_tool_calls=1, max_output_tokens=400
    )
    listing, call = response.output[0], response.output[1]
    assert isinstance(listing, McpListTools) and listing.error is None
    assert [t.name for t in listing.tools] == ["add"]  # filtered by allowed_tools
    assert isinstance(call, McpCall) and call.name == "add" and call.error is None
    arguments = __import__("json").loads(call.arguments)
    assert call.output == f"sum={arguments['a'] + arguments['b']}"
    # The bound reached, the model must answer: the last item is its text, no second call.
    assert all(item.type in ("message", "reasoning") for item in response.output[2:])
    assert "s3cret" not in response.model_dump_json()
    # The second turn reuses the chain's listing.
    follow = client.responses.create(
        model="tiny",
        input="again",
        previous_response_id=response.id,
        tools=[tool],
        max_tool_calls=1,
        tool_choice=_forced("add"),
        max_output_tokens=400,
    )
    assert not [item for item in follow.output if item.type == "mcp_list_tools"]
    assert follow.output[0].type == "mcp_call"
    stored = client.responses.retrieve(response.id)
    assert "s3cret" not in stored.model_dump_json()


def test_streamed_events_in_order(relay: Server, mcp_url: str) -> None:
    events = list(
        relay.client().responses.create(
            model="tiny",
            input="add",
            tools=[_tool(f"{mcp_url}/sse")],
            tool_choice=_forced("add"),
            max_tool_calls=1,
            max_output_tokens=400,
            stream=True,
        )
    )
    parsed = [TypeAdapter(ResponseStreamEvent).validate_python(e.model_dump()) for e in events]
    kinds: list[str] = [event.type for event in parsed]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.index("response.mcp_list_tools.in_progress") < kinds.index("response.mcp_list_tools.completed")
    order = ["response.mcp_call.in_progress", "response.mcp_call_arguments.done", "response.mcp_call.completed"]
    assert [kinds.index(kind) for kind in order] == sorted(kinds.index(kind) for kind in order)
    assert kinds[-1] in ("response.completed", "response.incomplete")
    final = events[-1].response  # type: ignore[union-attr]
    call = next(item for item in final.output if isinstance(item, McpCall))
    assert call.output is not None and call.output.startswith("sum=")


def test_listing_failure_is_an_error_item(relay: Server) -> None:
    dead = "http://127.0.0.1:9/mcp"  # the discard port: nothing listens
    response = relay.client().responses.create(model="tiny", input="hi", tools=[_tool(dead)], max_output_tokens=100)
    listing = response.output[0]
    assert isinstance(listing, McpListTools) and listing.error and listing.tools == []
    assert response.status in ("completed", "incomplete")


def test_unlisted_url_refused(relay: Server) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        relay.client().responses.create(model="tiny", input="hi", tools=[_tool("http://10.1.2.3/mcp")])
    assert "MLX_RELAY_MCP_ALLOW" in refused.value.message and refused.value.body["param"] == "tools"  # type: ignore[index]


def test_approval_round_trip(relay: Server, mcp_url: str) -> None:
    client = relay.client()
    tool = _tool(f"{mcp_url}/mcp", require_approval={"never": {"tool_names": ["echo"]}})
    asked = client.responses.create(
        model="tiny", input="add", tools=[tool], tool_choice=_forced("add"), max_output_tokens=400
    )
    request = asked.output[-1]
    assert isinstance(request, McpApprovalRequest) and request.name == "add"
    for approve in (True, False):
        answer: Any = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": approve}
        done = client.responses.create(
            model="tiny",
            input=[answer],
            previous_response_id=asked.id,
            tools=[tool],
            max_tool_calls=1,
            max_output_tokens=400,
        )
        calls = [item for item in done.output if isinstance(item, McpCall)]
        if approve:
            assert calls[0].approval_request_id == request.id and calls[0].output.startswith("sum=")  # type: ignore[union-attr]
        else:
            assert not [c for c in calls if c.approval_request_id == request.id]


def test_streamed_text_arrives_token_by_token(relay: Server, mcp_url: str) -> None:
    """The answer after the call streams as the model writes it, in several deltas; round two reuses round one's KV."""
    stream = relay.client().responses.create(
        model="tiny",
        input="flip, then say the side",
        # No other test offers `flip`, so round one's prompt is new to the cache past its first tokens; its
        # argument is an enum, so the forced call ends well inside max_output_tokens whatever the model samples.
        tools=[_tool(f"{mcp_url}/mcp", allowed_tools=["flip"])],
        tool_choice=_forced("flip"),  # round one only; round two is free to answer
        max_tool_calls=1,
        max_output_tokens=400,
        stream=True,
    )
    parsed = [TypeAdapter(ResponseStreamEvent).validate_python(e.model_dump()) for e in stream]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    kinds = [event.type for event in parsed]
    after = parsed[kinds.index("response.mcp_call.completed") + 1 :]
    deltas = [e for e in after if e.type in ("response.output_text.delta", "response.reasoning_text.delta")]
    assert len(deltas) > 1
    final = parsed[-1].response  # type: ignore[union-attr]
    # Round two's prompt extends round one's (~300 tokens, the tools kept in it) and reuses its KV; without
    # that only the first tokens other tests share with round one (under 100) would be cached.
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens >= 200
    # Each streamed item's pieces join to the text its finished item holds.
    for item in final.output[2:]:
        pieces = "".join(e.delta for e in deltas if e.item_id == item.id)
        assert pieces == "".join(part.text for part in item.content)  # type: ignore[union-attr]
