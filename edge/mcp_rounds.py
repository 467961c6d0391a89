"""What a turn with remote MCP tools does in any API: list the servers, run the calls, generate each round.

The Responses loop (edge/mcp_loop.py) and the Messages connector (edge/mcp_messages_loop.py) share this:
each listing and call goes through edge/mcp_tools.py (its timeout, its result cap) and is counted in
`/metrics` (edge/mcp_metrics.py); the calls of one turn are bounded; each round is one generation through
the engine with the conversation so far, whose usage adds up. `rounds` goes on while a round ran MCP calls
and nothing ended the turn; what ends it (text, a call of the client's, an approval request) is each API's
word, set in `ended` by its round.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

import attrs
import structlog
from quart import Quart

from edge.aliases import with_model
from edge.choice import submit_chosen
from edge.disconnect import current_client
from edge.mcp_metrics import McpMeter
from edge.mcp_tools import allow_list, call_tool, check_allowed, list_tools
from edge.state import state_of
from pipeline.channels import ReplyClosed
from pipeline.events import CompletionEvent, FinishReason, Summary, Usage
from pipeline.requests import Accepted, JsonObject, JsonValue, Tool, ToolChoice, ToolChoiceMode
from stages.messages import ReadBody
from wire.responses_mcp import McpServer

log = structlog.get_logger(stage="mcp")

# Calls one response may make when the request sets no bound of its own.
MAX_CALLS = 8

T = TypeVar("T")


def check_servers(app: Quart, servers: Sequence[McpServer], *, param: str) -> None:
    """Raises: RequestError (400) naming the first server the app's allow-list (`--mcp-allow`) does not name."""
    setting = state_of(app).running.settings.mcp_allow
    check_allowed(servers, allow_list(setting), tools_param=param)


def app_meter(app: Quart) -> McpMeter | None:
    """The app's MCP series in `/metrics`."""
    return state_of(app).running.metrics.mcp


@attrs.define(kw_only=True)
class McpRounds:
    """One turn's MCP state; after the rounds, `usage` and `summary` hold what all of them generated."""

    raw: JsonValue
    request_id: str
    trace_id: str
    meter: McpMeter | None = None
    usage: Usage = attrs.field(factory=lambda: Usage(prompt_tokens=0, completion_tokens=0))
    summary: Summary | None = None
    accepted: Accepted | None = None
    # The first round's prompt tokens the prompt cache held (None until its row is admitted).
    cached_tokens: Callable[[], int | None] = lambda: None
    # Set by a round whose output ends the turn whatever else it did.
    ended: bool = False
    # The offered MCP tools by name, with the server each belongs to.
    _tools: dict[str, tuple[McpServer, Tool]] = attrs.field(factory=dict)
    _calls: int = 0

    @property
    def bound(self) -> int:
        return MAX_CALLS

    @property
    def cut(self) -> bool:
        return self.summary is not None and self.summary.finish_reason is FinishReason.LENGTH

    def over_bound(self, name: str, *, pending: int = 0) -> bool:
        """Whether a call of `name` would pass the bound, with `pending` calls already promised this round."""
        if self._calls + pending < self.bound:
            return False
        log.info("mcp.call_ignored", trace_id=self.trace_id, tool=name, max_tool_calls=self.bound)
        return True

    async def listing(self, server: McpServer) -> JsonObject:
        """`server`'s `mcp_list_tools` item (edge/mcp_tools.py), its tools cut to those the request allows."""
        started = time.monotonic()
        listing = await list_tools(server)
        self._observe(server, "tools/list", started, failed=listing.get("error") is not None)
        tools = listing.get("tools")
        kept = [t for t in tools if isinstance(t, dict) and server.keeps(t)] if isinstance(tools, list) else []
        return {**listing, "tools": list[JsonValue](kept)}

    async def run_call(self, server: McpServer, call: JsonObject) -> JsonObject:
        """The `mcp_call` item `call` once `server` has run it; it counts toward the bound."""
        started = time.monotonic()
        done = await call_tool(server, call)
        self._calls += 1
        self._observe(server, "tools/call", started, failed=done.get("error") is not None)
        return done

    async def rounds(self, first: ToolChoice, one: Callable[[ToolChoice], AsyncIterator[T]]) -> AsyncIterator[T]:
        """Each round's steps: the first under `first`, the next free to answer, until one ends the turn."""
        choice = first
        while True:
            calls, self.ended = self._calls, False
            async for step in one(choice):
                yield step
            if self.ended or self._calls == calls or self.cut:
                return
            choice = ToolChoice(mode=ToolChoiceMode.AUTO)

    async def generate(self, decode: Callable[[JsonValue], object]) -> AsyncIterator[CompletionEvent]:
        """The round's events as the engine sends them; then `summary` and `usage` hold its end."""
        client = current_client()
        reply = await submit_chosen(
            ReadBody(self.raw),
            request_id=self.request_id,
            trace_id=self.trace_id,
            decode=with_model(decode),  # type: ignore[arg-type]
        )
        client.on_gone(reply.close)
        with reply:
            accepted = await reply.accepted()
            if self.accepted is None:
                self.cached_tokens = lambda: reply.cached_tokens
            self.accepted = accepted
            async for batch in reply:
                for event in batch:
                    yield event
        if reply.closed:
            raise ReplyClosed("the client has gone")
        self.summary = reply.summary
        self.usage = _added(self.usage, reply.summary.usage)

    def _observe(self, server: McpServer, method: str, started: float, *, failed: bool) -> None:
        if self.meter is not None:
            self.meter.observe(server.label, method, seconds=time.monotonic() - started, failed=failed)


def _added(total: Usage, more: Usage) -> Usage:
    return Usage(
        prompt_tokens=total.prompt_tokens + more.prompt_tokens,
        completion_tokens=total.completion_tokens + more.completion_tokens,
        cached_tokens=total.cached_tokens + more.cached_tokens,
        reasoning_tokens=total.reasoning_tokens + more.reasoning_tokens,
    )
