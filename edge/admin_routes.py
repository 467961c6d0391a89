"""Admin routes over the models (behind the API key, as every route but health is):
`POST /admin/models/{name}/load|unload|drain`.

`load` loads the model now (evicting as a request's load would); `unload`
stops it now (requests in flight end with a 503) and frees its memory;
`drain` refuses new requests to it and unloads it once those in flight
finish (bounded by MLX_RELAY_DRAIN_TIMEOUT). Each answers the model's
state afterwards; an unknown name is a 404 `model_not_found`.
"""

from __future__ import annotations

from quart import Blueprint, Response

from edge.choice import fleet
from edge.model_cards import card
from edge.redact import without_paths
from pipeline.requests import JsonObject
from wire.sse import dumps

routes = Blueprint("admin", __name__)


@routes.post("/admin/models/<path:name>/load")
async def load(name: str) -> Response:
    host = await fleet().load(name)
    return _state(host.name)


@routes.post("/admin/models/<path:name>/unload")
async def unload(name: str) -> Response:
    host = await fleet().unload(name, graceful=False)
    return _state(host.name)


@routes.post("/admin/models/<path:name>/drain")
async def drain(name: str) -> Response:
    host = await fleet().unload(name, graceful=True)
    return _state(host.name)


def _state(name: str) -> Response:
    body: JsonObject = card(fleet(), name) if fleet().several else {"id": name, **fleet().default.report()}
    return Response(dumps(without_paths(body)), content_type="application/json")
