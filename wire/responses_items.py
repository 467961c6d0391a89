"""`GET /v1/responses/{id}/input_items`: one page of a stored response's input items, in OpenAI's list shape,
each item as a resource (`input_item_resources`).

The query is OpenAI's: `limit` (1 to 100, default 20), `order` (`asc` or `desc`, default `desc`: newest
first) and `after` (an item id: the page starts past it, in the order asked). A bad value is a 400 naming
it, in OpenAI's words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.errors import invalid
from pipeline.requests import JsonObject, JsonValue

_DEFAULT_LIMIT = 20
_MAX_LIMIT = 100
_ORDERS = ("asc", "desc")
# Query parameters OpenAI's endpoint takes that change nothing here: `include` adds fields this store
# does not keep (file search results, image URLs, encrypted reasoning).
_IGNORED = frozenset({"include", "include[]"})


def input_items_page(items: Sequence[JsonObject], query: Mapping[str, str]) -> JsonObject:
    """The page of `items` (each with its `id`) that `query` asks for.

    Raises:
        RequestError: `limit`, `order` or `after` is not a value OpenAI takes, or another parameter is sent.
    """
    for name in query:
        if name not in ("limit", "order", "after") and name not in _IGNORED:
            raise invalid(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    limit = _limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in _ORDERS:
        message = f"Invalid value: '{order}'. Supported values are: 'asc' and 'desc'."
        raise invalid(message, param="order", code="invalid_value")
    ordered = list(items) if order == "asc" else list(reversed(items))
    after = query.get("after")
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise invalid(f"No input item with id '{after}' in this response.", param="after", code="invalid_value")
        ordered = ordered[ids.index(after) + 1 :]
    page: list[JsonValue] = list(ordered[:limit])
    return {
        "object": "list",
        "data": page,
        "first_id": _id(page[0]) if page else None,
        "last_id": _id(page[-1]) if page else None,
        "has_more": len(ordered) > limit,
    }


def _limit(raw: str | None) -> int:
    if raw is None:
        return _DEFAULT_LIMIT
    try:
        value = int(raw)
    except ValueError:
        raise invalid("Invalid 'limit': expected an integer.", param="limit", code="invalid_type") from None
    if value < 1:
        message = f"Invalid 'limit': integer below minimum value. Expected a value >= 1, but got {value} instead."
        raise invalid(message, param="limit", code="integer_below_min_value")
    if value > _MAX_LIMIT:
        message = (
            f"Invalid 'limit': integer above maximum value. Expected a value <= {_MAX_LIMIT}, but got {value} instead."
        )
        raise invalid(message, param="limit", code="integer_above_max_value")
    return value


def _id(item: JsonValue) -> JsonValue:
    return item.get("id") if isinstance(item, dict) else None


def input_item_resources(items: Sequence[JsonObject]) -> list[JsonObject]:
    """The stored input as `GET /v1/responses/{id}/input_items` lists it, each item with an id, a
    message's text as a list of parts (`input_text`; `output_text` for the assistant's)."""
    return [{"id": f"item_{i}", **_as_resource(item)} for i, item in enumerate(items)]


def _as_resource(item: JsonObject) -> JsonObject:
    if item.get("type", "message") != "message":
        return item
    content = item.get("content")
    parts: JsonValue = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    if item.get("role") != "assistant":
        return {**item, "type": "message", "content": parts}
    # The assistant's turn reads back as an output message: its parts are output text, and it is complete.
    outputs: list[JsonValue] = [
        {"annotations": [], "logprobs": [], **part, "type": "output_text"} if isinstance(part, dict) else part
        for part in (parts if isinstance(parts, list) else [])
    ]
    return {"status": "completed", **item, "type": "message", "content": outputs}
