"""OpenAI's Files and Batch formats and Anthropic's Message Batches, as pure functions (docs/apis.md).

In: an uploaded JSONL file's bytes, a create body, the stored facts of a file or batch as a mapping.
Out: the checked input lines, the API objects (`file`, `batch`, `message_batch`), one batch output line,
and one Anthropic results line read back from it. Nothing here touches a disk or a clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime

import attrs

from pipeline.errors import RequestError, invalid
from pipeline.requests import JsonObject, JsonValue

# The routes a batch may name, as OpenAI lists them (`/v1/messages` is Anthropic's own batches').
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
MESSAGES = "/v1/messages"
WINDOW = "24h"
# The error codes of lines that never ran: OpenAI writes expired ones to the error file with this code.
EXPIRED = "batch_expired"
_EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
_MAX_METADATA = 16


@attrs.frozen(kw_only=True)
class BatchLine:
    """One request of a batch: its caller's id, the route it targets and the body sent there."""

    custom_id: str
    url: str
    body: JsonObject

    def as_json(self) -> JsonObject:
        return {"custom_id": self.custom_id, "method": "POST", "url": self.url, "body": self.body}


@attrs.frozen(kw_only=True)
class BatchCreate:
    input_file_id: str
    endpoint: str
    metadata: dict[str, str] | None


def read_jsonl(data: bytes) -> list[BatchLine]:
    """Every line of a batch input file, checked before the file is accepted.

    Raises:
        RequestError: the first line that is not a JSON object with a unique `custom_id`, `method: "POST"`,
            a `url` and an object `body`; its message names the line (1-based).
    """
    lines: list[BatchLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        line = _line(raw, number)
        if line.custom_id in seen:
            raise _bad_line(number, f"custom_id {line.custom_id!r} is used twice; each must be unique")
        seen.add(line.custom_id)
        lines.append(line)
    if not lines:
        raise invalid("The file has no request lines", param="file", code="invalid_file")
    return lines


def _line(raw: bytes, number: int) -> BatchLine:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _bad_line(number, "is not valid JSON") from None
    if not isinstance(value, dict):
        raise _bad_line(number, "is not a JSON object")
    custom_id, method, url, body = (value.get(name) for name in ("custom_id", "method", "url", "body"))
    if not isinstance(custom_id, str) or not custom_id:
        raise _bad_line(number, "has no string 'custom_id'")
    if method != "POST":
        raise _bad_line(number, "must have 'method': 'POST'")
    if not isinstance(url, str) or not url:
        raise _bad_line(number, "has no string 'url'")
    if not isinstance(body, dict):
        raise _bad_line(number, "has no object 'body'")
    return BatchLine(custom_id=custom_id, url=url, body=body)


def _bad_line(number: int, reason: str) -> RequestError:
    return invalid(f"Line {number} of the file {reason}", param="file", code="invalid_file")


def decode_create(value: JsonValue) -> BatchCreate:
    """`POST /v1/batches`'s body. Raises: RequestError for a missing file id, an endpoint or window not served."""
    if not isinstance(value, dict):
        raise invalid("The body must be a JSON object")
    file_id = value.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise invalid("'input_file_id' is required", param="input_file_id")
    endpoint = value.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise invalid(f"'endpoint' must be one of {', '.join(ENDPOINTS)}", param="endpoint")
    if value.get("completion_window") != WINDOW:
        raise invalid("'completion_window' must be '24h'", param="completion_window")
    return BatchCreate(input_file_id=file_id, endpoint=str(endpoint), metadata=_metadata(value.get("metadata")))


def _metadata(value: JsonValue) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > _MAX_METADATA or not all(isinstance(v, str) for v in value.values()):
        raise invalid("'metadata' must be an object of at most 16 string values", param="metadata")
    return {key: str(item) for key, item in value.items()}


def decode_message_batch(value: JsonValue) -> list[BatchLine]:
    """Anthropic's `POST /v1/messages/batches` body as batch lines to `/v1/messages`.

    Raises: RequestError for a body without `requests`, an entry without `custom_id` or `params`, a repeated id.
    """
    requests = value.get("requests") if isinstance(value, dict) else None
    if not isinstance(requests, list) or not requests:
        raise invalid("requests: a non-empty list is required", param="requests")
    lines: list[BatchLine] = []
    for index, entry in enumerate(requests):
        custom_id = entry.get("custom_id") if isinstance(entry, dict) else None
        params = entry.get("params") if isinstance(entry, dict) else None
        if not isinstance(custom_id, str) or not custom_id or not isinstance(params, dict):
            raise invalid(f"requests.{index}: 'custom_id' and 'params' are required", param="requests")
        if params.get("stream"):
            raise invalid(f"requests.{index}.params.stream: streaming is not supported in a batch", param="requests")
        lines.append(BatchLine(custom_id=custom_id, url=MESSAGES, body=params))
    if len({line.custom_id for line in lines}) != len(lines):
        raise invalid("requests: each custom_id must be unique", param="requests")
    return lines


def line_refusal(line: BatchLine, endpoint: str) -> JsonObject | None:
    """The error of a line the batch refuses before sending it (another route, a stream); None when it may run."""
    if line.url != endpoint:
        return {"code": "invalid_url", "message": f"The line's url {line.url!r} is not the batch's endpoint {endpoint}"}
    if line.body.get("stream") is True:
        return {"code": "invalid_request", "message": "'stream' is not supported in a batch"}
    return None


def output_line(*, line_id: str, custom_id: str, status: int, request_id: str, body: JsonValue) -> JsonObject:
    """One line of a batch's output or error file, after the request ran (OpenAI's batch output format)."""
    response: JsonObject = {"status_code": status, "request_id": request_id, "body": body}
    return {"id": line_id, "custom_id": custom_id, "response": response, "error": None}


def failed_line(*, line_id: str, custom_id: str, error: JsonObject) -> JsonObject:
    """A line that never ran: refused before it was sent, or past the batch's window."""
    return {"id": line_id, "custom_id": custom_id, "response": None, "error": error}


def expired_error() -> JsonObject:
    return {"code": EXPIRED, "message": _EXPIRED_MESSAGE}


def file_object(stored: Mapping[str, JsonValue]) -> JsonObject:
    """OpenAI's `file` object from a stored file's facts (id, filename, purpose, bytes, created_at)."""
    fields = ("id", "bytes", "created_at", "filename", "purpose")
    return {"object": "file", **{name: stored[name] for name in fields}, "status": "processed", "expires_at": None}


_BATCH_TIMES = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at")


def batch_object(stored: Mapping[str, JsonValue]) -> JsonObject:
    """OpenAI's `batch` object from a stored batch's facts."""
    counts: JsonObject = {name: stored[name] for name in ("total", "completed", "failed")}
    times: JsonObject = {name: stored[name] for name in (*_BATCH_TIMES, "cancelled_at")}
    return {
        "id": stored["id"],
        "object": "batch",
        "endpoint": stored["endpoint"],
        "errors": None,
        "input_file_id": stored["input_file_id"],
        "completion_window": WINDOW,
        "status": stored["status"],
        "output_file_id": stored["output_file_id"],
        "error_file_id": stored["error_file_id"],
        "created_at": stored["created_at"],
        "expires_at": stored["expires_at"],
        **times,
        "request_counts": counts,
        "metadata": stored["metadata"],
    }


def _rfc3339(seconds: JsonValue) -> str | None:
    if not isinstance(seconds, int | float):
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def message_batch_object(stored: Mapping[str, JsonValue], results_url: str) -> JsonObject:
    """Anthropic's `message_batch` object; `results_url` is given once processing has ended."""
    status = stored["status"]
    ended = status in ("completed", "failed", "expired", "cancelled")
    done, total = _int(stored["completed"]) + _int(stored["failed"]), _int(stored["total"])
    expired = _int(stored["expired"])
    counts: JsonObject = {
        "processing": 0 if ended else total - done,
        "succeeded": _int(stored["completed"]),
        "errored": _int(stored["failed"]) - expired,
        "canceled": total - done if status == "cancelled" else 0,
        "expired": expired,
    }
    ended_at = stored["completed_at"] or stored["expired_at"] or stored["cancelled_at"] or stored["failed_at"]
    return {
        "id": stored["id"],
        "type": "message_batch",
        "processing_status": "ended" if ended else ("canceling" if status == "cancelling" else "in_progress"),
        "request_counts": counts,
        "ended_at": _rfc3339(ended_at),
        "created_at": _rfc3339(stored["created_at"]),
        "expires_at": _rfc3339(stored["expires_at"]),
        "archived_at": None,
        "cancel_initiated_at": _rfc3339(stored["cancelling_at"]),
        "results_url": results_url if ended else None,
    }


def _int(value: JsonValue) -> int:
    return value if isinstance(value, int) else 0


def message_result(line: Mapping[str, JsonValue]) -> JsonObject:
    """An Anthropic results line from one output or error line of the batch's files."""
    error, response = line.get("error"), line.get("response")
    if isinstance(error, dict):
        kind = "expired" if error.get("code") == EXPIRED else "errored"
        result: JsonObject = {"type": kind}
        if kind == "errored":
            result["error"] = {"type": "error", "error": {"type": "invalid_request_error", "message": error["message"]}}
        return {"custom_id": line["custom_id"], "result": result}
    assert isinstance(response, dict)
    body = response.get("body")
    if response.get("status_code") == 200:
        return {"custom_id": line["custom_id"], "result": {"type": "succeeded", "message": body}}
    return {"custom_id": line["custom_id"], "result": {"type": "errored", "error": body}}


def canceled_result(custom_id: str) -> JsonObject:
    return {"custom_id": custom_id, "result": {"type": "canceled"}}


def list_page(objects: list[JsonObject], *, after: str | None, limit: int) -> JsonObject:
    """OpenAI's list page: the objects after the one whose id is `after`, at most `limit` of them."""
    ids = [item["id"] for item in objects]
    start = ids.index(after) + 1 if after in ids else 0
    page = objects[start : start + limit]
    return {
        "object": "list",
        "data": page,  # type: ignore[dict-item]
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(objects),
    }


def page_limit(raw: str | None, *, default: int = 20, most: int = 100) -> int:
    """A list's `limit` query parameter. Raises: RequestError outside 1..most."""
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise invalid(f"'limit' must be an integer from 1 to {most}", param="limit")
    return int(raw)
