"""OpenAI's Batch API: create, retrieve, list and cancel (docs/apis.md, "Files and batches").

A blueprint `edge/application.py` registers. A batch's lines come from an uploaded file and run in
`edge/batch_runner.py` beneath live traffic; a batch is visible only to the key that created it when keys are
set (another key's is a 404, as OpenAI answers for another organisation's).
"""

from __future__ import annotations

from typing import cast

import anyio
from quart import Blueprint, Response, request

from edge.batch_runner import BatchRunner
from edge.error_responses import json_response
from edge.file_routes import file_not_found, files, owned_file
from edge.owners import caller
from edge.state import app_state
from pipeline.errors import ErrorKind, RequestError
from stages.prompt.parse import load_json
from store.batch_folders import BatchRecord
from wire.batches import batch_object, decode_create, list_page, page_limit, read_jsonl

routes = Blueprint("batches", __name__)


def runner() -> BatchRunner:
    return app_state().running.batch_runner


async def owned_batch(batch_id: str, api: str) -> BatchRecord:
    """The caller's batch of this API, as it stands now. Raises: RequestError 404 otherwise."""
    record = runner().record(batch_id) or await anyio.to_thread.run_sync(runner().batches.get, batch_id)
    if record is None or record.api != api or record.owner != caller():
        raise RequestError(kind=ErrorKind.NOT_FOUND, message=f"No batch found with id '{batch_id}'.", param="id")
    return record


async def owned_batches(api: str) -> list[BatchRecord]:
    """The caller's batches of this API, newest first, the running ones as they stand now."""
    stored = await anyio.to_thread.run_sync(runner().batches.listed)
    owner = caller()
    return [runner().record(r.id) or r for r in stored if r.api == api and r.owner == owner]


@routes.post("/v1/batches")
async def create() -> Response:
    asked = decode_create(load_json(cast(bytes, await request.get_data(as_text=False))))
    try:
        stored = await owned_file(asked.input_file_id)
    except RequestError:
        raise file_not_found(asked.input_file_id) from None
    data = await anyio.to_thread.run_sync(files().content, stored.id)
    lines = await anyio.to_thread.run_sync(read_jsonl, data)
    record = await runner().create(
        api="openai",
        endpoint=asked.endpoint,
        input_file_id=stored.id,
        lines=lines,
        metadata=asked.metadata,
        owner=caller(),
    )
    return json_response(batch_object(record.facts()))


@routes.get("/v1/batches/<batch_id>")
async def retrieve(batch_id: str) -> Response:
    return json_response(batch_object((await owned_batch(batch_id, "openai")).facts()))


@routes.get("/v1/batches")
async def list_batches() -> Response:
    listed = [batch_object(record.facts()) for record in await owned_batches("openai")]
    return json_response(
        list_page(listed, after=request.args.get("after"), limit=page_limit(request.args.get("limit")))
    )


@routes.post("/v1/batches/<batch_id>/cancel")
async def cancel(batch_id: str) -> Response:
    await owned_batch(batch_id, "openai")
    record = await runner().cancel(batch_id)
    assert record is not None
    return json_response(batch_object(record.facts()))
