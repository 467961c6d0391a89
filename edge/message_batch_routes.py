"""Anthropic's Message Batches: create, retrieve, list, results, cancel, delete (docs/apis.md).

A blueprint `edge/application.py` registers; the batches run on the same runner as OpenAI's (`edge/batch_runner.py`),
each request as a line to `/v1/messages`, and are shown in Anthropic's shapes (`wire/batches.py`).
"""

from __future__ import annotations

from typing import cast

import anyio
from quart import Blueprint, Response, request

from edge.batch_routes import owned_batch, owned_batches, runner
from edge.error_responses import json_response
from edge.owners import caller
from pipeline.errors import invalid
from pipeline.requests import JsonObject
from stages.prompt.parse import load_json
from store.batch_folders import ENDED, ERRORS, OUTPUT, BatchRecord
from wire.batches import MESSAGES, canceled_result, decode_message_batch, message_batch_object, message_result
from wire.sse import dumps

routes = Blueprint("message_batches", __name__)
_API = "anthropic"


def _shown(record: BatchRecord) -> JsonObject:
    results_url = f"{request.host_url.rstrip('/')}/v1/messages/batches/{record.id}/results"
    return message_batch_object(record.facts(), results_url)


@routes.post("/v1/messages/batches")
async def create() -> Response:
    lines = decode_message_batch(load_json(cast(bytes, await request.get_data(as_text=False))))
    record = await runner().create(
        api=_API, endpoint=MESSAGES, input_file_id="", lines=lines, metadata=None, owner=caller()
    )
    return json_response(_shown(record))


@routes.get("/v1/messages/batches/<batch_id>")
async def retrieve(batch_id: str) -> Response:
    return json_response(_shown(await owned_batch(batch_id, _API)))


@routes.get("/v1/messages/batches")
async def list_batches() -> Response:
    shown = [_shown(record) for record in await owned_batches(_API)]
    ids = [item["id"] for item in shown]
    after, before = request.args.get("after_id"), request.args.get("before_id")
    limit = _limit(request.args.get("limit"))
    # Newest first: `after_id` pages toward older batches, `before_id` toward newer ones.
    if before in ids:
        end = ids.index(before)
        page, more = shown[max(0, end - limit) : end], end - limit > 0
    else:
        start = ids.index(after) + 1 if after in ids else 0
        page, more = shown[start : start + limit], start + limit < len(shown)
    first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
    return json_response({"data": page, "has_more": more, "first_id": first, "last_id": last})  # type: ignore[dict-item]


def _limit(raw: str | None) -> int:
    if raw is None:
        return 20
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise invalid("limit: must be an integer from 1 to 1000", param="limit")
    return int(raw)


@routes.post("/v1/messages/batches/<batch_id>/cancel")
async def cancel(batch_id: str) -> Response:
    await owned_batch(batch_id, _API)
    record = await runner().cancel(batch_id)
    assert record is not None
    return json_response(_shown(record))


@routes.delete("/v1/messages/batches/<batch_id>")
async def delete(batch_id: str) -> Response:
    record = await owned_batch(batch_id, _API)
    if record.status not in ENDED:
        raise invalid(f"Batch {batch_id} is still processing: cancel it, then delete it once it has ended")
    await anyio.to_thread.run_sync(runner().batches.delete, batch_id)
    return json_response({"id": batch_id, "type": "message_batch_deleted"})


@routes.get("/v1/messages/batches/<batch_id>/results")
async def results(batch_id: str) -> Response:
    record = await owned_batch(batch_id, _API)
    if record.status not in ENDED:
        raise invalid(f"Batch {batch_id} has not ended yet; its results are ready once processing_status is ended")
    lines = await anyio.to_thread.run_sync(_result_lines, record)
    return Response("".join(dumps(line) + "\n" for line in lines), content_type="application/binary")


def _result_lines(record: BatchRecord) -> list[JsonObject]:
    """Each request's result: those that ran from the results files, the rest of a cancelled batch `canceled`."""
    store = runner().batches
    ran = store.results(record.id, OUTPUT) + store.results(record.id, ERRORS)
    done = {line["custom_id"] for line in ran}
    rest = [line["custom_id"] for line in store.input_lines(record.id) if line["custom_id"] not in done]
    return [message_result(line) for line in ran] + [canceled_result(str(custom_id)) for custom_id in rest]
