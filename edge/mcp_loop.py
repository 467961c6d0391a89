"""A Responses turn with `mcp` tools: list the servers, then rounds of generation and MCP calls at the edge.

Each round is one generation through the engine with the conversation so far (the prompt cache
keeps the KV of the earlier part, so a round prefills only what the last one added). A round that
ends in calls to MCP tools has them run here and goes on; one that ends in text, in a call to the
client's own tools, or in a call that needs the client's approval ends the turn. `max_tool_calls` (else
edge/mcp_rounds.py's `MAX_CALLS`) bounds the calls: past it, as OpenAI documents, a call the model makes is
ignored.
The tools stay in every round's prompt, so that each round's prompt extends the last one's and
reuses its KV (a round offered no tools would render another system prompt and prefill it all).

`steps` yields each output item as it opens ("added") and as it ends ("done"), and a message's or
reasoning's text in pieces as the model writes it ("delta", wire/responses_mcp_round.py), so the
route can stream them or collect the finished items (edge/mcp_route.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs

from edge.mcp_rounds import McpRounds
from pipeline.errors import invalid
from pipeline.requests import JsonObject, ToolChoice, ToolChoiceMode
from wire.responses_mcp import (
    McpServer,
    approval_item,
    approval_responses,
    call_item,
    finished_call,
    offered,
)
from wire.responses_mcp_round import RoundItems, Step
from wire.responses_requests import ResponsesRequest, to_chat

_DECLINED: JsonObject = {"type": "mcp_tool_execution_error", "content": "The user declined this call."}

_GOES_ON = ("mcp_call", "reasoning")


@attrs.define(kw_only=True)
class McpLoop(McpRounds):
    """One turn's rounds; after `steps` is spent, `output`, `usage` and `summary` hold the response's."""

    decoded: ResponsesRequest
    history: tuple[JsonObject, ...]
    instructions: str | None
    output: list[JsonObject] = attrs.field(factory=list)
    # What the model reads besides `output`: declined calls, which are not output items.
    _seen: list[JsonObject] = attrs.field(factory=list)

    async def steps(self) -> AsyncIterator[Step]:
        listings = _earlier_listings(self.history)
        for server in self.decoded.mcp_servers:
            if server.label not in listings:
                listing = await self.listing(server)
                yield "added", {**listing, "tools": []}
                self.output.append(listing)
                yield "done", listing
                if "error" not in listing:
                    listings[server.label] = listing
        self._tools = offered(self.decoded.mcp_servers, listings)
        async for step in self._approved():
            yield step
        async for step in self.rounds(self._first_choice(), self._round):
            yield step

    @property
    def bound(self) -> int:
        return self.decoded.max_tool_calls or super().bound

    def _first_choice(self) -> ToolChoice:
        forced = self.decoded.mcp_choice
        if forced is None:
            return self.decoded.tool_choice
        names = [name for name, (server, _t) in self._tools.items() if server.label == forced.label]
        if forced.name is not None and forced.name not in names:
            raise invalid(
                f"Invalid 'tool_choice.name': {forced.name!r} is not a listed tool of {forced.label!r}.",
                param="tool_choice.name",
            )
        if forced.name is None and not names:
            raise invalid(f"Invalid 'tool_choice': {forced.label!r} lists no tools.", param="tool_choice")
        mode = ToolChoiceMode.NAMED if forced.name is not None or len(names) == 1 else ToolChoiceMode.REQUIRED
        return ToolChoice(mode=mode, name=forced.name or (names[0] if len(names) == 1 else None))

    async def _on_item(self, item: JsonObject) -> AsyncIterator[Step]:
        """One item of a round: an MCP call runs here (or asks for approval); any other is output as it is."""
        entry = self._tools.get(str(item.get("name"))) if item.get("type") == "function_call" else None
        if entry is None or str(item.get("name")) in self.decoded.tool_specs:
            yield "added", item
            self._out(item)
            yield "done", item
            return
        # Past the bound a call is ignored, whole or not (as OpenAI documents `max_tool_calls`).
        if self.over_bound(str(item.get("name"))):
            return
        server = entry[0]
        arguments, name = str(item.get("arguments", "")), str(item["name"])
        if item.get("status") == "incomplete":
            # Cut short by max_output_tokens: an MCP call still (never the client's function), not run, since its
            # arguments are not whole.
            cut = {**call_item(server.label, name, arguments), "status": "incomplete"}
            yield "added", cut
            self._out(cut)
            yield "done", cut
            return
        if server.needs_approval(name):
            request = approval_item(server.label, name, arguments)
            yield "added", request
            self._out(request)
            yield "done", request
            return
        async for step in self._call(server, call_item(server.label, name, arguments)):
            yield step

    async def _call(self, server: McpServer, call: JsonObject) -> AsyncIterator[Step]:
        yield "added", call
        done = await self.run_call(server, call)
        self._out(done)
        yield "done", done

    async def _approved(self) -> AsyncIterator[Step]:
        """Runs, or reports declined to the model, each call this request's `mcp_approval_response`s answer."""
        requests = {str(item.get("id")): item for item in self.history if item.get("type") == "mcp_approval_request"}
        for request_id, approve in approval_responses(self.decoded.input).items():
            request = requests.get(request_id)
            if request is None:
                raise invalid(
                    f"Invalid 'approval_request_id': no approval request {request_id!r} in the earlier response.",
                    param="input",
                )
            entry = self._tools.get(str(request.get("name")))
            call = call_item(
                str(request.get("server_label")),
                str(request.get("name")),
                str(request.get("arguments")),
                approval_request_id=request_id,
            )
            if approve and entry is not None:
                async for step in self._call(entry[0], call):
                    yield step
            else:
                self._seen.append(finished_call(call, output=None, error=_DECLINED))

    def _out(self, item: JsonObject) -> None:
        self.output.append(item)
        self._seen.append(item)

    async def _round(self, choice: ToolChoice) -> AsyncIterator[Step]:
        """One generation: its text as it comes, then each call it made, run or held for approval."""
        before = len(self.output)
        mcp_tools = tuple(tool for name, (_s, tool) in self._tools.items() if name not in self.decoded.tool_specs)
        tools = self.decoded.tools + mcp_tools
        if not tools:
            choice = ToolChoice()
        request = attrs.evolve(self.decoded, input=(*self.decoded.input, *self._seen), tools=tools, tool_choice=choice)
        chat = to_chat(request, self.history, self.instructions)
        items = RoundItems(specs=self.decoded.tool_specs)
        async for event in self.generate(lambda _body: chat):
            for step in items.feed(event):
                yield self._kept(step)
        assert self.summary is not None
        closing, calls = items.end(cut=self.cut)
        for step in closing:
            yield self._kept(step)
        for item in calls:
            async for step in self._on_item(item):
                yield step
        # Text, a call of the client's or an approval request ends the turn; only MCP calls go on.
        self.ended = any(item.get("type") not in _GOES_ON for item in self.output[before:])

    def _kept(self, step: Step) -> Step:
        if step[0] == "done":
            self._out(step[1])
        return step


def _earlier_listings(history: tuple[JsonObject, ...]) -> dict[str, JsonObject]:
    """The chain's listings by server label (OpenAI lists a server once per conversation)."""
    return {
        str(item.get("server_label")): item
        for item in history
        if item.get("type") == "mcp_list_tools" and item.get("error") is None
    }
