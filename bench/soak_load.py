"""The soak's clients: a bounded, mixed load over every API.

Each client loops over a seeded random choice of request kinds until the
deadline: chat (streaming and not, with tools, with a JSON schema), plain
completions (and a regex constraint), Responses turns chained by
`previous_response_id` (stored, and sometimes not), Anthropic Messages
streams, and streams the client drops after a few events. Prompts draw on a
few hundred words, so the prompt cache sees both repeats and new prefixes;
a conversation grows for a few turns and then starts over. Only
`127.0.0.1` is ever called.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import httpx

_WORDS = (
    "river stone cloud ember lantern harbor meadow quartz signal velvet orbit canyon willow ledger falcon "
    "prism garden copper beacon tundra violet anchor summit pepper glacier mosaic cobalt thistle marble "
    "compass saffron delta walnut comet fern juniper lattice nectar opal pylon quill raven sable tidal "
    "umber vapor wicker yarrow zephyr amber basalt cedar dune echo flint grove heron iris jasper kelp"
).split()
_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "count": {"type": "integer"}},
    "required": ["name", "count"],
    "additionalProperties": False,
}
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@attrs.define
class Tally:
    done: Counter[str] = attrs.field(factory=Counter)
    failed: Counter[str] = attrs.field(factory=Counter)
    last_error: str = ""
    # Per-request state the server still holds after the load (bench/soak.py).
    after: dict[str, int] = attrs.field(factory=dict)

    @property
    def total(self) -> int:
        return sum(self.done.values())

    @property
    def errors(self) -> int:
        return sum(self.failed.values())


@attrs.define
class Client:
    http: httpx.AsyncClient
    rng: random.Random
    max_tokens: int
    tally: Tally
    # The Responses chain and the chat conversation this client is in.
    previous: str | None = None
    history: list[dict[str, Any]] = attrs.field(factory=list)

    async def run(self, deadline: float) -> None:
        kinds: dict[str, Callable[[], Awaitable[None]]] = {
            "chat": self.chat,
            "chat_stream": self.chat_stream,
            "chat_tools": self.chat_tools,
            "chat_json_schema": self.chat_json_schema,
            "completion": self.completion,
            "completion_regex": self.completion_regex,
            "responses": self.responses,
            "messages_stream": self.messages_stream,
            "disconnect": self.disconnect,
        }
        names = list(kinds)
        while time.monotonic() < deadline:
            name = self.rng.choice(names)
            try:
                await kinds[name]()
                self.tally.done[name] += 1
            except (httpx.HTTPError, ValueError, KeyError) as error:
                self.tally.failed[name] += 1
                self.tally.last_error = f"{name}: {error!r}"[:300]

    def words(self, low: int, high: int) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(self.rng.randint(low, high)))

    def tokens(self) -> int:
        return self.rng.randint(max(1, self.max_tokens // 4), self.max_tokens)

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = await self.http.post(path, json=body)
        reply.raise_for_status()
        result: dict[str, Any] = reply.json()
        return result

    async def stream(self, path: str, body: dict[str, Any], *, keep: int | None = None) -> int:
        """Read a stream's SSE lines to the end, or drop it after `keep` events."""
        events = 0
        async with self.http.stream("POST", path, json=body) as reply:
            reply.raise_for_status()
            async for line in reply.aiter_lines():
                if line.startswith("data:"):
                    events += 1
                    if keep is not None and events >= keep:
                        break  # leaving the block closes the connection mid-stream
        return events

    async def chat(self) -> None:
        # A conversation that grows a turn at a time, then starts over.
        if len(self.history) >= 8 or self.rng.random() < 0.15:
            self.history = [{"role": "system", "content": "You are terse. " + self.words(5, 30)}]
        self.history.append({"role": "user", "content": self.words(5, 60)})
        body = {"model": "m", "messages": self.history, "max_tokens": self.tokens(), "temperature": 0.8}
        reply = await self.post("/v1/chat/completions", body)
        self.history.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"] or ""})

    async def chat_stream(self) -> None:
        messages = [{"role": "user", "content": self.words(10, 200)}]
        body = {
            "model": "m",
            "messages": messages,
            "max_tokens": self.tokens(),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        await self.stream("/v1/chat/completions", body)

    async def chat_tools(self) -> None:
        messages = [{"role": "user", "content": "Weather in " + self.words(1, 3) + "?"}]
        choice = self.rng.choice(["auto", "required"])
        body = {"model": "m", "messages": messages, "max_tokens": self.tokens(), "tools": _TOOLS, "tool_choice": choice}
        await self.post("/v1/chat/completions", body)

    async def chat_json_schema(self) -> None:
        messages = [{"role": "user", "content": "Describe as JSON: " + self.words(3, 40)}]
        schema = {"type": "json_schema", "json_schema": {"name": "thing", "schema": _SCHEMA, "strict": True}}
        body = {"model": "m", "messages": messages, "max_tokens": self.max_tokens, "response_format": schema}
        await self.post("/v1/chat/completions", body)

    async def completion(self) -> None:
        body = {
            "model": "m",
            "prompt": self.words(5, 300),
            "max_tokens": self.tokens(),
            "stream": self.rng.random() < 0.5,
        }
        if body["stream"]:
            await self.stream("/v1/completions", body)
        else:
            await self.post("/v1/completions", body)

    async def completion_regex(self) -> None:
        # A fresh pattern now and then, so the grammar cache sees new keys too.
        pattern = self.rng.choice(
            [r"[a-z]{3,8}( [a-z]{2,6}){0,3}", r"\d{1,4}-\d{2}", rf"(yes|no|maybe{self.rng.randint(0, 999)})"]
        )
        body = {"model": "m", "prompt": self.words(5, 50), "max_tokens": self.tokens(), "guided_regex": pattern}
        await self.post("/v1/completions", body)

    async def responses(self) -> None:
        if self.previous is None or self.rng.random() < 0.2:
            self.previous = None
        body: dict[str, Any] = {"model": "m", "input": self.words(5, 60), "max_output_tokens": max(16, self.tokens())}
        body["store"] = self.rng.random() < 0.85
        if self.previous is not None:
            body["previous_response_id"] = self.previous
        reply = await self.post("/v1/responses", body)
        self.previous = reply["id"] if body["store"] else None

    async def messages_stream(self) -> None:
        body = {
            "model": "m",
            "max_tokens": self.tokens(),
            "stream": True,
            "system": self.words(3, 20),
            "messages": [{"role": "user", "content": self.words(5, 120)}],
        }
        await self.stream("/v1/messages", body)

    async def disconnect(self) -> None:
        messages = [{"role": "user", "content": self.words(10, 150)}]
        body = {"model": "m", "messages": messages, "max_tokens": max(32, self.max_tokens), "stream": True}
        await self.stream("/v1/chat/completions", body, keep=self.rng.randint(1, 6))
