"""Routes for model work besides generation: embeddings, rerank and score, tokenize and detokenize.

A blueprint `app.py` registers; its errors render through `app.py`'s
handlers like every other route's. Each route reads its body with the
API's decoder, asks the engine's `ModelWork`, and shapes the answer.
"""

from __future__ import annotations

import time
import uuid
from typing import cast

from quart import Blueprint, Response, current_app, request

from edge import guard
from pipeline.requests import JsonValue
from stages.engine import Engine
from stages.parse import load_json
from wire.embeddings import decode_embeddings, embeddings_body
from wire.scoring import decode_rerank, decode_score, rerank_body, score_body
from wire.sse import dumps
from wire.tokenize import decode_detokenize, decode_tokenize, tokenize_body

routes = Blueprint("model_work", __name__)


def _engine() -> Engine:
    return cast(Engine, current_app.extensions["engine"])


async def _body() -> JsonValue:
    return load_json(cast(bytes, await request.get_data(as_text=False)))


def _json(body: JsonValue, trace_id: str | None = None) -> Response:
    headers = {"x-request-id": trace_id} if trace_id else None
    return Response(dumps(body), content_type="application/json", headers=headers)


@routes.post("/v1/embeddings")
async def embeddings() -> Response:
    decoded = decode_embeddings(await _body())
    request_id = f"embd-{uuid.uuid4().hex}"
    trace_id = guard.trace_id(request_id)
    engine = _engine()
    result = await engine.work.embed(decoded, request_id=request_id, trace_id=trace_id)
    return _json(embeddings_body(result, model=engine.info.name, encoding=decoded.encoding_format), trace_id)


@routes.post("/v1/rerank")
@routes.post("/rerank")
async def rerank() -> Response:
    decoded, documents, top_n, return_documents = decode_rerank(await _body())
    request_id = f"rerank-{uuid.uuid4().hex}"
    trace_id = guard.trace_id(request_id)
    engine = _engine()
    scores = await engine.work.score(decoded, request_id=request_id, trace_id=trace_id)
    body = rerank_body(scores, documents, id=request_id, model=engine.info.name, top_n=top_n, return_documents=return_documents)
    return _json(body, trace_id)


@routes.post("/v1/score")
@routes.post("/score")
async def score() -> Response:
    decoded = decode_score(await _body())
    request_id = f"score-{uuid.uuid4().hex}"
    trace_id = guard.trace_id(request_id)
    engine = _engine()
    scores = await engine.work.score(decoded, request_id=request_id, trace_id=trace_id)
    return _json(score_body(scores, id=request_id, model=engine.info.name, created=int(time.time())), trace_id)


@routes.post("/tokenize")
async def tokenize() -> Response:
    decoded = decode_tokenize(await _body())
    engine = _engine()
    tokens, strs = await engine.work.tokenize(decoded)
    return _json(tokenize_body(tokens, max_model_len=engine.info.context_window, token_strs=strs))


@routes.post("/detokenize")
async def detokenize() -> Response:
    tokens = decode_detokenize(await _body())
    return _json({"prompt": await _engine().work.detokenize(tokens)})
