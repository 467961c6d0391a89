"""Pages of a stored response's input items, as OpenAI's list endpoint gives them."""

from __future__ import annotations

import pytest

from pipeline.errors import RequestError
from pipeline.requests import JsonObject
from wire.responses_items import input_items_page

ITEMS: list[JsonObject] = [{"id": f"item_{i}", "type": "message"} for i in range(30)]


def ids(page: JsonObject) -> list[object]:
    data = page["data"]
    assert isinstance(data, list)
    return [item["id"] for item in data if isinstance(item, dict)]


def test_the_default_is_twenty_newest_first() -> None:
    page = input_items_page(ITEMS, {})
    assert ids(page) == [f"item_{i}" for i in range(29, 9, -1)]
    assert page["first_id"] == "item_29" and page["last_id"] == "item_10" and page["has_more"] is True


def test_ascending_pages_follow_after() -> None:
    first = input_items_page(ITEMS, {"order": "asc", "limit": "12"})
    assert ids(first) == [f"item_{i}" for i in range(12)] and first["has_more"] is True
    second = input_items_page(ITEMS, {"order": "asc", "limit": "100", "after": "item_11"})
    assert ids(second) == [f"item_{i}" for i in range(12, 30)] and second["has_more"] is False


def test_an_empty_page_has_no_ids() -> None:
    page = input_items_page(ITEMS, {"after": "item_0"})
    assert page == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


@pytest.mark.parametrize(
    ("query", "param", "code"),
    [
        ({"limit": "-1"}, "limit", "integer_below_min_value"),
        ({"limit": "0"}, "limit", "integer_below_min_value"),
        ({"limit": "101"}, "limit", "integer_above_max_value"),
        ({"limit": "abc"}, "limit", "invalid_type"),
        ({"order": "newest"}, "order", "invalid_value"),
        ({"after": "item_99"}, "after", "invalid_value"),
        ({"before": "item_3"}, "before", "unknown_parameter"),
    ],
)
def test_a_bad_value_is_a_400_naming_it(query: dict[str, str], param: str, code: str) -> None:
    with pytest.raises(RequestError) as refused:
        input_items_page(ITEMS, query)
    assert refused.value.status == 400 and refused.value.param == param and refused.value.code == code
