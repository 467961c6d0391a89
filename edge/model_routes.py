"""Routes for model work besides generation: embeddings, rerank and score, tokenize and detokenize; the model list.

A blueprint `edge/application.py` registers; its errors render through `edge/error_responses.py`'s
handlers like every other route's. Each route reads its body with the
API's decoder, asks the engine's `ModelWork`, and shapes the answer.
"""

from __future__ import annotations

import time
import uuid
from typing import cast

from quart import Blueprint, Response, request

from edge import guard
from edge.aliases import work_served_as
from edge.choice import chosen, current_engine, fleet
from edge.disconnect import ends_with_client
from edge.fields import decode_here
from edge.model_cards import card, fleet_cards, input_modalities
from edge.status_routes import model_state
from pipeline.requests import JsonObject, JsonValue
from stages.adapters import not_found
from stages.engine.engine import Engine
from stages.engine.speech import SpeechEngine
from stages.engine.work_service import ModelWork
from stages.prompt.parse import load_json
from wire.embeddings import decode_embeddings, embeddings_body
from wire.scoring import decode_rerank, decode_score, rerank_body, score_body
from wire.sse import dumps
from wire.vllm_tokenize import decode_detokenize, decode_tokenize, tokenize_body

routes = Blueprint("model_work", __name__)


def _engine() -> Engine:
    return current_engine()


async def _body() -> JsonValue:
    return load_json(cast(bytes, await request.get_data(as_text=False)))


def _json(body: JsonValue, trace_id: str | None = None) -> Response:
    headers = {"x-request-id": trace_id} if trace_id else None
    return Response(dumps(body), content_type="application/json", headers=headers)


@routes.post("/v1/embeddings")
@ends_with_client
async def embeddings() -> Response:
    decoded = decode_here("embeddings", decode_embeddings, await _body())
    request_id = f"embd-{uuid.uuid4().hex}"
    trace_id = guard.trace_id(request_id)
    async with chosen(decoded.model):
        work, model = _answering(decoded.model)
        result = await work.embed(decoded, request_id=request_id, trace_id=trace_id)
    return _json(embeddings_body(result, model=model, encoding=decoded.encoding_format), trace_id)


@routes.post("/v1/rerank")
@routes.post("/rerank")
@ends_with_client
async def rerank() -> Response:
    decoded, documents, top_n, return_documents = decode_rerank(await _body())
    request_id = f"rerank-{uuid.uuid4().hex}"
    trace_id = guard.trace_id(request_id)
    async with chosen(decoded.model):
        work, model = _answering(decoded.model)
        scores = await work.score(decoded, request_id=request_id, trace_id=trace_id)
    body = rerank_body(scores, documents, id=request_id, model=model, top_n=top_n, return_documents=return_documents)
    return _json(body, trace_id)


@routes.post("/v1/score")
@routes.post("/score")
@ends_with_client
async def score() -> Response:
    decoded = decode_score(await _body())
    request_id = f"score-{uuid.uuid4().hex}"
    trace_id = guard.trace_id(request_id)
    async with chosen(decoded.model):
        work, model = _answering(decoded.model)
        scores = await work.score(decoded, request_id=request_id, trace_id=trace_id)
    return _json(score_body(scores, id=request_id, model=model, created=int(time.time())), trace_id)


@routes.post("/tokenize")
async def tokenize() -> Response:
    decoded = decode_tokenize(await _body())
    async with chosen(decoded.model):
        work = _tokenizing(decoded.model)
        tokens, strs = await work.tokenize(decoded)
    return _json(tokenize_body(tokens, max_model_len=work.context_window, token_strs=strs))


@routes.post("/detokenize")
async def detokenize() -> Response:
    decoded = decode_detokenize(await _body())
    async with chosen(decoded.model):
        return _json({"prompt": await _tokenizing(decoded.model).detokenize(decoded.tokens)})


def _tokenizing(model: str | None) -> ModelWork:
    """The named model's tokenizer and window (a dedicated embedding model's differ from the chat model's);
    the chat model's when none is named, since generation is what prompts are mostly counted for."""
    engine = _engine()
    return engine.model_work(model) if model else engine.work


@routes.get("/v1/models")
async def models() -> Response:
    if _by_fleet():
        return _json({"object": "list", "data": list(fleet_cards(fleet()))})
    served = _engine().served
    return _json({"object": "list", "data": [_model_card(model_id) for model_id in (*served.ids, *served.aliases)]})


@routes.get("/v1/models/<path:model_id>")
async def model(model_id: str) -> Response:
    if _by_fleet():
        if model_id not in fleet().known_names():
            raise not_found(model_id, "model", served=tuple(fleet().known_names()))
        return _json(card(fleet(), model_id))
    served = _engine().served
    if not served.knows(model_id):
        raise not_found(model_id, "model", served=(*served.ids, *served.aliases))
    return _json(_model_card(model_id))


def _by_fleet() -> bool:
    """Cards from the fleet: several models, or a speech model alone (it has no chat engine to read)."""
    return fleet().several or isinstance(fleet().default.engine, SpeechEngine)


def _model_card(model_id: str) -> JsonObject:
    engine = _engine()
    info = engine.info
    card: JsonObject = {
        "id": model_id,
        "object": "model",
        "created": 0,
        "owned_by": "mlx-relay",
        "context_window": info.context_window,
        "max_model_len": info.context_window,
        "input_modalities": input_modalities(engine.work.vision is not None),
    }
    if model_id == info.name:
        return {**card, "state": model_state(engine)["state"]}
    if engine.embedder is not None and model_id == engine.embedder.name:
        window = engine.embedder.context_window
        return {**card, "context_window": window, "max_model_len": window, "input_modalities": input_modalities(False)}
    # As vLLM's cards do, an alias names the model it stands for and an adapter itself; `parent` is the base model.
    return {**card, "root": engine.served.aliases.get(model_id, model_id), "parent": info.name}


def _answering(model: str | None) -> tuple[ModelWork, str]:
    """Who answers embeddings, rerank or score naming `model`, and the name the reply carries (the alias asked by)."""
    engine = _engine()
    work = engine.model_work(model)
    if work is engine.work:
        return work, work_served_as(engine.served, model)
    return work, model if model and model in engine.served.aliases else work.name
