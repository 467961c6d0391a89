"""Which top-level request fields a decoder did not read, and the policy for them.

Every field a known client sends is read by a decoder (honoured, or refused
by name with a 400) or listed here as inert: accepted because it cannot
change the output (`user`, `metadata`, ...). Anything else is unknown to
this server: by default the request is served and the names are reported
(a log line and the `x-mlx-relay-ignored-fields` header, as vLLM warns);
in strict mode (`MLX_RELAY_STRICT_FIELDS`) they are a 400 naming them, as
OpenAI's and Anthropic's APIs answer an unrecognized argument. Only the
top level is checked: nested objects are read by their own decoders,
which refuse what would change the output. Pure; no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pipeline.errors import excerpt, invalid, quote
from pipeline.requests import JsonValue

T = TypeVar("T")

IGNORED_HEADER = "x-mlx-relay-ignored-fields"
# Names a message or header lists; a body of thousands of keys is named in part.
_LISTED = 20
_PLAIN = re.compile(r"[A-Za-z0-9_.\-]{1,100}")

# Fields each API accepts that cannot change the output (or are read before the decoder, as `model`).
_COMMON = ("model", "user", "metadata", "stream", "store", "service_tier", "safety_identifier")
# Prompt caching is this server's own; a client's caching hints steer nothing else.
_CACHING = ("prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "session_id")
INERT: dict[str, frozenset[str]] = {
    # `verbosity` is a hint OpenAI's models were trained to follow; a local model was not.
    "chat": frozenset((*_COMMON, *_CACHING, "verbosity", "moderation")),
    "completions": frozenset((*_COMMON, "prompt_cache_key", "session_id")),
    # `include` asks for fields of output items this server does not make. (`max_tool_calls` is read: it bounds
    # the rounds of remote MCP calls, edge/mcp_loop.py.)
    "responses": frozenset((*_COMMON, *_CACHING, "moderation", "include", "stream_options")),
    "messages": frozenset((*_COMMON, "speed", "cache_control", "inference_geo", "workspace_id", "user_profile_id")),
    "embeddings": frozenset(("model", "user")),
    # Ollama's: `keep_alive` is the route's (edge/ollama_routes.py); `shift` and `truncate` steer only a
    # prompt past the window, which this server refuses rather than cuts.
    "ollama_chat": frozenset(("model", "stream", "keep_alive", "shift", "truncate")),
    "ollama_generate": frozenset(("model", "stream", "keep_alive", "shift", "truncate")),
    "ollama_embed": frozenset(("model", "keep_alive")),
}


class ReadKeys(dict[str, Any]):
    """A request body that notes each top-level key a decoder looks up."""

    def __init__(self, items: dict[str, Any]) -> None:
        super().__init__(items)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)


def decode_noting_unread(
    decode: Callable[[JsonValue], T], value: JsonValue, api: str, *, strict: bool
) -> tuple[T, tuple[str, ...]]:
    """`decode(value)`, and the top-level fields it neither read nor counts inert, sorted.

    Raises:
        RequestError: the decoder's own refusals; in strict mode, any unknown field.
    """
    if not isinstance(value, dict):
        return decode(value), ()
    body = ReadKeys(value)
    decoded = decode(body)
    unread = unknown_fields(value, body.read, INERT[api])
    if strict and unread:
        raise refusal(unread)
    return decoded, unread


def unknown_fields(body: dict[str, Any], read: Iterable[str], inert: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted(set(body) - set(read) - inert))


def refusal(names: tuple[str, ...]) -> Exception:
    listed = ", ".join(quote(name) for name in names[:_LISTED])
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    message = f"Unrecognized request argument supplied: {listed}{more} (this server refuses unknown fields)"
    return invalid(message, param=excerpt(names[0], 80))


def header_value(names: tuple[str, ...]) -> str:
    """The names as a header carries them: plain names as they are, any other as a JSON string (ASCII)."""
    shown = [name if _PLAIN.fullmatch(name) else json.dumps(name) for name in names[:_LISTED]]
    more = [f"(+{len(names) - _LISTED} more)"] if len(names) > _LISTED else []
    return excerpt(", ".join(shown + more), 1000)
