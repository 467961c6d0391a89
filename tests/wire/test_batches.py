"""wire/batches.py: the JSONL check, the create body, and Anthropic's results read from output lines (tables)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.errors import RequestError
from wire.batches import decode_create, decode_message_batch, list_page, message_result, read_jsonl

_GOOD = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}


def _file(*lines: object) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (_file(_GOOD, b"{oops"), "Line 2 of the file is not valid JSON"),
        (_file([1]), "Line 1 of the file is not a JSON object"),
        (_file({**_GOOD, "method": "GET"}), "'method': 'POST'"),
        (_file({**_GOOD, "custom_id": 3}), "custom_id"),
        (_file({**_GOOD, "body": "x"}), "'body'"),
        (_file(_GOOD, _GOOD), "used twice"),
        (b"\n\n", "no request lines"),
    ],
)
def test_a_bad_file_is_refused_naming_its_line(data: bytes, words: str) -> None:
    with pytest.raises(RequestError) as refused:
        read_jsonl(data)
    assert words in refused.value.message


def test_a_good_file_reads_every_line() -> None:
    lines = read_jsonl(_file(_GOOD, {**_GOOD, "custom_id": "b"}) + b"\n")
    assert [line.custom_id for line in lines] == ["a", "b"]


@pytest.mark.parametrize(
    "body",
    [
        {"endpoint": "/v1/chat/completions", "completion_window": "24h"},
        {"input_file_id": "f", "endpoint": "/v1/messages", "completion_window": "24h"},
        {"input_file_id": "f", "endpoint": "/v1/embeddings", "completion_window": "1h"},
        {"input_file_id": "f", "endpoint": "/v1/embeddings", "completion_window": "24h", "metadata": {"k": 1}},
    ],
)
def test_a_create_body_the_server_cannot_honour_is_refused(body: dict[str, object]) -> None:
    with pytest.raises(RequestError):
        decode_create(body)  # type: ignore[arg-type]


def test_message_batches_refuse_streams_and_repeated_ids() -> None:
    params: dict[str, Any] = {"model": "m", "max_tokens": 1, "messages": []}
    with pytest.raises(RequestError):
        decode_message_batch({"requests": [{"custom_id": "a", "params": {**params, "stream": True}}]})
    with pytest.raises(RequestError):
        decode_message_batch({"requests": [{"custom_id": "a", "params": params}] * 2})


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ({"custom_id": "a", "response": {"status_code": 200, "body": {"id": "m"}}, "error": None}, "succeeded"),
        ({"custom_id": "a", "response": {"status_code": 400, "body": {"type": "error"}}, "error": None}, "errored"),
        ({"custom_id": "a", "response": None, "error": {"code": "batch_expired", "message": "late"}}, "expired"),
        ({"custom_id": "a", "response": None, "error": {"code": "invalid_url", "message": "no"}}, "errored"),
    ],
)
def test_anthropic_results_read_the_output_lines(line: dict[str, Any], kind: str) -> None:
    result: Any = message_result(line)["result"]
    assert result["type"] == kind


def test_a_list_page_after_an_id() -> None:
    objects: list[Any] = [{"id": str(i)} for i in range(5)]
    page: Any = list_page(objects, after="1", limit=2)
    assert [item["id"] for item in page["data"]] == ["2", "3"] and page["has_more"] is True
    assert list_page(objects, after="3", limit=5)["has_more"] is False
