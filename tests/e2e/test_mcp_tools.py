"""Remote MCP tools in Responses and Messages: a real FastMCP server on loopback, the tiny model forced to call it.

The random model's words are not asserted, only the items' shapes and the loop's course: the forced
call reaches the real server, whose deterministic answer comes back in the `mcp_call` item.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import anthropic
import openai
import pytest
import uvicorn
from anthropic.types.beta import BetaMCPToolResultBlock, BetaMCPToolUseBlock
from mcp.server.fastmcp import FastMCP
from openai.types.responses import ResponseStreamEvent
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall, McpListTools
from pydantic import TypeAdapter
from starlette.applications import Starlette

from tests.conftest import Server, ServerFactory
from tests.e2e.test_metrics import scrape

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


def test_a_call_cut_by_max_output_tokens_is_an_incomplete_mcp_call_not_run(relay: Server, mcp_url: str) -> None:
    tool = _tool(f"{mcp_url}/mcp", allowed_tools=["add"])
    response = relay.client().responses.create(
        model="tiny", input="add", tools=[tool], tool_choice=_forced("add"), max_output_tokens=3
    )
    call = response.output[-1]
    # The server's tool, never a function of the client's; its arguments are not whole, so it is not run.
    assert isinstance(call, McpCall) and call.name == "add" and call.server_label == tool["server_label"]
    assert call.status == "incomplete" and call.output is None and call.error is None
    assert response.status == "incomplete"


def test_listing_failure_is_an_error_item(relay: Server) -> None:
    dead = "http://127.0.0.1:9/mcp"  # the discard port: nothing listens
    raw = relay.client().responses.with_raw_response.create(
        model="tiny",
        input="hi",
        tools=[_tool(dead)],
        max_output_tokens=100,
        extra_headers={"x-request-id": "not plain"},
    )
    response = raw.parse()
    # A trace id the guard does not take is not echoed: the response's id stands for it, as on every route.
    assert raw.headers["x-request-id"] == response.id
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
        # Greedy: a sampled round two could end at its first token, leaving no text to stream.
        temperature=0,
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


def _connector(url: str, **extra: Any) -> Any:
    """A connector request's arguments, forcing `flip` (an enum argument: the call ends well inside max_tokens)."""
    server = {"type": "url", "url": url, "name": "calc", "authorization_token": "s3cret"}
    server["tool_configuration"] = {"enabled": True, "allowed_tools": ["flip"]}
    return {
        "model": "tiny",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "flip"}],
        "mcp_servers": [server],
        "tool_choice": {"type": "tool", "name": "flip"},
        "betas": ["mcp-client-2025-04-04"],
        **extra,
    }


def _flipped(content: list[Any]) -> None:
    """The first call is the forced `flip`, its result right after its use, answered by the real server."""
    use = next(block for block in content if isinstance(block, BetaMCPToolUseBlock))
    result = content[content.index(use) + 1]
    assert use.name == "flip" and use.server_name == "calc" and use.input["side"] in ("heads", "tails")
    assert isinstance(result, BetaMCPToolResultBlock) and result.tool_use_id == use.id and not result.is_error
    assert [part.text for part in result.content] == [f"called:{use.input['side']}"]  # type: ignore[union-attr]


def test_messages_connector_calls_and_answers(relay: Server, mcp_url: str) -> None:
    message = relay.anthropic_client().beta.messages.create(**_connector(f"{mcp_url}/mcp"))
    _flipped(message.content)
    assert message.stop_reason in ("end_turn", "max_tokens", "pause_turn")
    assert message.usage.output_tokens > 0 and "s3cret" not in message.model_dump_json()
    assert "s3cret" not in relay.logs()


def test_messages_connector_streams_its_blocks(relay: Server, mcp_url: str) -> None:
    with relay.anthropic_client().beta.messages.stream(**_connector(f"{mcp_url}/sse")) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    starts = [event for event in events if event.type == "content_block_start"]
    assert [event.index for event in starts] == list(range(len(starts))) == list(range(len(final.content)))
    kinds = [event.content_block.type for event in starts]
    assert kinds.index("mcp_tool_use") + 1 == kinds.index("mcp_tool_result")
    # The SDK's accumulator builds the blocks from the events: the call's input from its input_json_delta.
    _flipped(final.content)


def test_messages_connector_needs_its_beta(relay: Server, mcp_url: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        relay.anthropic_client().messages.create(
            model="tiny",
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"mcp_servers": [{"type": "url", "url": f"{mcp_url}/mcp", "name": "calc"}]},
        )
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error" and "anthropic-beta: mcp-client-2025-04-04" in error["message"]


def test_messages_connector_refuses_an_origin_not_allowed(relay: Server) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        relay.anthropic_client().beta.messages.create(**_connector("http://10.1.2.3/mcp"))
    assert "MLX_RELAY_MCP_ALLOW" in refused.value.message and "s3cret" not in refused.value.message


def test_mcp_metrics_by_server(relay: Server, mcp_url: str) -> None:
    client = relay.anthropic_client()
    before = scrape(relay)
    client.beta.messages.create(**_connector(f"{mcp_url}/mcp"))
    with pytest.raises(anthropic.BadRequestError, match="could not be listed"):
        client.beta.messages.create(**_connector("http://127.0.0.1:9/mcp"))  # the discard port: nothing listens
    after = scrape(relay)

    def moved(name: str, method: str) -> float:
        key = f"mlx_relay:{name}{{method={method},server_label=calc}}"
        return after[key] - before.get(key, 0.0)

    assert moved("mcp_requests_total", "tools/list") >= 2 and moved("mcp_requests_total", "tools/call") >= 1
    assert moved("mcp_request_errors_total", "tools/list") == 1
    assert moved("mcp_request_seconds_count", "tools/call") >= 1
