"""A Messages turn through Anthropic's MCP connector: list the servers, then rounds of generation and MCP calls.

The rounds, the bound, the listing and calling are edge/mcp_rounds.py's, shared with Responses `mcp`
tools. A round's text and thinking go out as the model writes them; its calls are held to the round's
end, where each MCP call becomes an `mcp_tool_use` block, then each runs and its `mcp_tool_result` block
follows (the uses first: the content then reads back as the model wrote it, one assistant message with
its calls, then their results). The next round reads the content made so far as a client sending it
back would (wire/anthropic_mcp.py's `round_messages`), so its prompt extends the last one's and reuses
its KV. A call of the client's own tools is a `tool_use` block and ends the turn, as without the
connector. Rounds go on while MCP calls ran (a model may write before it calls, so text does not end
them); past the bound a call is ignored and, when nothing else ended the turn, it stops `pause_turn`.

`steps` yields each text or thinking piece, and each client call, as a completion event, and each MCP
block as a JSON object, so the route can stream them or collect the content (edge/mcp_messages_route.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import attrs

from edge.mcp_rounds import McpRounds
from pipeline.errors import invalid
from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, ToolCall
from pipeline.requests import JsonObject, JsonValue, Tool, ToolChoice
from wire.anthropic import content_blocks
from wire.anthropic_mcp import PAUSED, McpMessages, first_choice, result_block, round_messages, use_block
from wire.responses_mcp import McpServer, call_item, offered

Step = CompletionEvent | JsonObject


@attrs.define(kw_only=True)
class MessagesMcpLoop(McpRounds):
    """One connector turn; after `steps` is spent, `content`, `usage`, `summary` and `reason` hold its message's."""

    request: McpMessages
    content: list[JsonObject] = attrs.field(factory=list)
    # The last round's MCP calls met the bound.
    paused: bool = False
    _choice: ToolChoice = ToolChoice()

    async def prepare(self) -> None:
        """Lists every server's tools and reads the first round's choice among them.

        Raises:
            RequestError: 400 for a server whose tools cannot be listed (there is no block to report it in),
                or a `tool_choice` that names no tool offered.
        """
        listings: dict[str, JsonObject] = {}
        for server in self.request.servers:
            listing = await self.listing(server)
            error = listing.get("error")
            if error is not None:
                raise invalid(
                    f"mcp_servers: the tools of the MCP server {server.label!r} could not be listed: {error}",
                    param="mcp_servers",
                )
            listings[server.label] = listing
        self._tools = offered(self.request.servers, listings)
        self._choice = first_choice(self.request, self._offered())

    @property
    def reason(self) -> str | None:
        """A stop reason the last round's summary cannot say: `pause_turn` when the bound stopped its calls."""
        return PAUSED if self.paused and not self.ended and not self.cut else None

    async def steps(self) -> AsyncIterator[Step]:
        async for step in self.rounds(self._choice, self._round):
            yield step

    def _offered(self) -> tuple[Tool, ...]:
        own = self.request.chat.tools
        names = {tool.name for tool in own}
        return own + tuple(tool for name, (_server, tool) in self._tools.items() if name not in names)

    async def _round(self, choice: ToolChoice) -> AsyncIterator[Step]:
        chat, tools = self.request.chat, self._offered()
        request = attrs.evolve(
            chat,
            messages=chat.messages + round_messages(self.content),
            tools=tools,
            tool_choice=choice if tools else ToolChoice(),
        )
        said: list[CompletionEvent] = []
        calls: list[ToolCall] = []
        call_last = False
        async for event in self.generate(lambda _body: request):
            if isinstance(event, ToolCall):
                calls.append(event)
                call_last = True
            elif isinstance(event, (TextDelta, ReasoningDelta)) and event.text:
                said.append(event)
                call_last = False
                yield event
        self._add(content_blocks(said))
        async for step in self._calls_of(calls, cut=self.cut and call_last):
            yield step

    async def _calls_of(self, calls: list[ToolCall], *, cut: bool) -> AsyncIterator[Step]:
        """The round's calls: the client's go back to it, the MCP ones are shown, then run and answered."""
        self.paused = False
        own = {tool.name for tool in self.request.chat.tools}
        runs: list[tuple[McpServer, ToolCall, JsonObject]] = []
        for call in calls:
            entry = None if call.name in own else self._tools.get(call.name)
            if entry is None:
                self.ended = True
                self._add(content_blocks([call]))
                yield call
                continue
            if self.over_bound(call.name, pending=len(runs)):
                self.paused = True
                continue
            use = use_block(call, entry[0].label)
            self.content.append(use)
            yield use
            # A call cut short by max_tokens is shown, not run: its input is not whole.
            if not (cut and call is calls[-1]):
                runs.append((entry[0], call, use))
        for server, call, use in runs:
            done = await self.run_call(server, call_item(server.label, call.name, call.arguments))
            result = result_block(use, done)
            self.content.append(result)
            yield result

    def _add(self, blocks: Sequence[JsonValue]) -> None:
        self.content.extend(block for block in blocks if isinstance(block, dict))
