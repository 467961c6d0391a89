"""OpenAI's Files API for batch input: upload, list, retrieve, content, delete (docs/apis.md, "Files and batches").

A blueprint `edge/application.py` registers. An upload is a multipart form (`file`, `purpose: "batch"`) whose JSONL is
checked line by line before it is stored (`wire/batches.py`); files live in `store/files.py`'s folder, each
visible only to the key that uploaded it when keys are set.
"""

from __future__ import annotations

from typing import cast

import anyio
from quart import Blueprint, Response, request

from edge.error_responses import json_response
from edge.owners import caller
from edge.state import app_state
from pipeline.errors import ErrorKind, RequestError, invalid
from store.files import FileLimitError, FileStore, StoredFile
from wire.batches import file_object, list_page, page_limit, read_jsonl

routes = Blueprint("files", __name__)


def files() -> FileStore:
    return app_state().running.files


def file_not_found(file_id: str) -> RequestError:
    return RequestError(kind=ErrorKind.NOT_FOUND, message=f"No such File object: {file_id}", param="id")


async def owned_file(file_id: str) -> StoredFile:
    """The caller's file. Raises: RequestError 404 for a file that is not there or is another key's."""
    stored = await anyio.to_thread.run_sync(files().get, file_id)
    if stored is None or stored.owner != caller():
        raise file_not_found(file_id)
    return stored


@routes.post("/v1/files")
async def upload() -> Response:
    form, uploads = await request.form, await request.files
    if form.get("purpose") != "batch":
        raise invalid("'purpose' must be 'batch': this server keeps files for batches only", param="purpose")
    upload = uploads.get("file")
    if upload is None:
        raise invalid("'file' is required", param="file")

    def read_checked() -> bytes:
        data = cast(bytes, upload.read())
        read_jsonl(data)
        return data

    # Reading a large file (spooled to disk past its size) and parsing it are blocking work: off the event loop
    # (docs/STYLE.md, "CPU work off the loop").
    data = await anyio.to_thread.run_sync(read_checked)
    add = files().add
    try:
        stored = await anyio.to_thread.run_sync(
            lambda: add(filename=upload.filename or "batch.jsonl", purpose="batch", data=data, owner=caller())
        )
    except FileLimitError as error:
        raise invalid(str(error), param="file", code="file_limit") from None
    return json_response(file_object(stored.facts()))


@routes.get("/v1/files")
async def list_files() -> Response:
    owner, purpose = caller(), request.args.get("purpose")
    listed = await anyio.to_thread.run_sync(files().listed)
    mine = [file_object(f.facts()) for f in listed if f.owner == owner and purpose in (None, f.purpose)]
    if request.args.get("order") == "asc":
        mine.reverse()
    page = list_page(
        mine, after=request.args.get("after"), limit=page_limit(request.args.get("limit"), default=10000, most=10000)
    )
    return json_response(page)


@routes.get("/v1/files/<file_id>")
async def retrieve(file_id: str) -> Response:
    return json_response(file_object((await owned_file(file_id)).facts()))


@routes.get("/v1/files/<file_id>/content")
async def content(file_id: str) -> Response:
    stored = await owned_file(file_id)
    data = await anyio.to_thread.run_sync(files().content, stored.id)
    return Response(data, content_type="application/octet-stream")


@routes.delete("/v1/files/<file_id>")
async def delete(file_id: str) -> Response:
    stored = await owned_file(file_id)
    await anyio.to_thread.run_sync(files().delete, stored.id)
    return json_response({"id": stored.id, "object": "file", "deleted": True})
