"""The routes of stored Responses that background work adds to: start, retrieve (or re-attach), cancel, delete.

`start_background` takes a prepared Responses turn that asked `background: true` (the responses route calls
it); the blueprint serves `GET` and `DELETE /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`. A
response is read only under the key that made it (edge/owners.py). docs/apis.md, "Background responses".
"""

from __future__ import annotations

import time

import anyio
from quart import Blueprint, Response, current_app, request

from edge import guard
from edge.aliases import with_model
from edge.background import BackgroundRuns, Run
from edge.choice import submit_chosen
from edge.error_responses import json_response
from edge.responses_turn import ResponsesTurn, response_not_found, stored_response
from edge.state import app_state
from edge.store import store_call
from pipeline.errors import invalid, unsupported
from stages.messages import ReadBody
from store.response_store import StoredResponse, unfinished
from wire.responses import ResponsesStream

routes = Blueprint("background", __name__)
# How long a cancel waits for the row to stop and the run to store what it made.
CANCEL_WAIT_SECONDS = 10.0


def runs() -> BackgroundRuns:
    return app_state().running.background_runs


async def start_background(turn: ResponsesTurn, read: ReadBody) -> Response:
    """Submits the turn through admission like any request, stores it `queued` and answers at once.

    The answer is the `queued` response, or with `stream: true` its events as they come (a client that
    leaves stops reading, not the run). Raises: RequestError as admission and the parse stage refuse.
    """
    if turn.decoded.mcp_servers:
        raise unsupported("background")  # MCP rounds run inside the request (edge/mcp_route.py)
    trace_id = guard.trace_id(turn.request_id)
    reply = await submit_chosen(read, request_id=turn.request_id, trace_id=trace_id, decode=with_model(turn.decode))
    try:
        accepted = await reply.accepted()
    except BaseException:
        reply.close()
        raise
    protocol = turn.make_protocol(accepted, turn.request_id, reply)
    assert isinstance(protocol, ResponsesStream)
    protocol.background = True
    record = StoredResponse(
        id=turn.request_id,
        created_at=time.time(),
        body=protocol.snapshot("queued"),
        input_items=turn.replay,
        instructions=turn.instructions,
        owner=turn.owner,
    )
    run = Run(record=record, reply=reply, protocol=protocol)
    run.add(protocol.start())
    await runs().begin(run)
    if turn.decoded.stream:
        return _event_stream(turn.request_id, -1)
    return json_response(record.body)


@routes.get("/v1/responses/<response_id>")
async def get_response(response_id: str) -> Response:
    """The response as it stands; with `stream=true`, a background response's events after `starting_after`."""
    stored = await stored_response(current_app, response_id)
    if request.args.get("stream", "false").lower() != "true":
        return json_response(stored.body)
    if stored.body.get("background") is not True:
        raise invalid("Only a background response can be streamed again", param="stream")
    after = request.args.get("starting_after", "-1")
    if not after.lstrip("-").isdigit():
        raise invalid("'starting_after' must be an integer", param="starting_after")
    return _event_stream(response_id, int(after))


@routes.post("/v1/responses/<response_id>/cancel")
async def cancel_response(response_id: str) -> Response:
    """Stops a background response and answers it `cancelled` with what it made; a finished one, unchanged."""
    stored = await stored_response(current_app, response_id)
    if stored.body.get("background") is not True:
        raise invalid("Cannot cancel a synchronous response.", param=None)
    run = runs().running(response_id)
    if run is None or not unfinished(stored):
        return json_response(stored.body)
    run.cancel()
    with anyio.move_on_after(CANCEL_WAIT_SECONDS):
        await run.ended.wait()
    return json_response((await stored_response(current_app, response_id)).body)


@routes.delete("/v1/responses/<response_id>")
async def delete_response(response_id: str) -> Response:
    """Deletes a stored response, stopping it first if it is running here."""
    await stored_response(current_app, response_id)
    run = runs().running(response_id)
    if run is not None:
        run.cancel(delete=True)
    if not await store_call(app_state().running.response_store, lambda store: store.delete(response_id)):
        raise response_not_found(response_id, param=None)
    return json_response({"id": response_id, "object": "response", "deleted": True})


def _event_stream(response_id: str, after: int) -> Response:
    frames = runs().frames_after(response_id, after)
    return Response(frames, content_type="text/event-stream", headers={"cache-control": "no-cache"})
