"""`POST /v1/rerank` (Jina/Cohere, as vLLM and llama.cpp serve it) and `POST /v1/score` (vLLM).

Rerank: `query`, `documents` (strings, or objects with `text`), optional
`top_n` and `return_documents`; the results sorted by relevance, best
first. Score: `text_1` and `text_2`, each a string or an array: one
against many, or pairwise when both are arrays of the same length.
"""

from __future__ import annotations

from pipeline.errors import invalid
from pipeline.requests import JsonObject, JsonValue
from pipeline.work_requests import ScoreRequest, Scores
from wire.field_reads import as_body, as_str, read_bool, read_int, read_str

# Documents in one request, as for embeddings' inputs.
MAX_DOCUMENTS = 2048
_RERANK_KNOWN = frozenset({"model", "query", "documents", "top_n", "return_documents", "user"})
_SCORE_KNOWN = frozenset({"model", "text_1", "text_2", "user"})


def _refuse_unknown(body: JsonObject, known: frozenset[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise invalid(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])


def decode_rerank(value: JsonValue) -> tuple[ScoreRequest, list[str], int | None, bool]:
    """The pairs to score, the documents' texts, `top_n` and `return_documents`."""
    body = as_body(value)
    _refuse_unknown(body, _RERANK_KNOWN)
    query = _non_empty(as_str(body.get("query"), "query"), "query")
    raw = body.get("documents")
    if not isinstance(raw, list) or not raw:
        raise invalid("'documents' must be a non-empty array", param="documents")
    if len(raw) > MAX_DOCUMENTS:
        raise invalid(f"'documents' may hold at most {MAX_DOCUMENTS} items, got {len(raw)}", param="documents")
    documents = [_document(item, f"documents[{i}]") for i, item in enumerate(raw)]
    top_n = read_int(body, "top_n", minimum=1)
    return_documents = read_bool(body, "return_documents")
    request = ScoreRequest(model=read_str(body, "model"), pairs=tuple((query, doc) for doc in documents))
    return request, documents, top_n, True if return_documents is None else return_documents


def _document(value: JsonValue, param: str) -> str:
    if isinstance(value, dict):
        return _non_empty(as_str(value.get("text"), f"{param}.text"), f"{param}.text")
    return _non_empty(as_str(value, param), param)


def _non_empty(text: str, param: str) -> str:
    if not text:
        raise invalid(f"'{param}' must not be empty", param=param)
    return text


def decode_score(value: JsonValue) -> ScoreRequest:
    body = as_body(value)
    _refuse_unknown(body, _SCORE_KNOWN)
    first, second = _texts(body.get("text_1"), "text_1"), _texts(body.get("text_2"), "text_2")
    if len(first) == 1:
        pairs = tuple((first[0], text) for text in second)
    elif len(first) == len(second):
        pairs = tuple(zip(first, second))
    else:
        raise invalid(
            f"'text_1' has {len(first)} items and 'text_2' {len(second)}: give one, or as many", param="text_1"
        )
    if len(pairs) > MAX_DOCUMENTS:
        raise invalid(f"At most {MAX_DOCUMENTS} pairs may be scored at once, got {len(pairs)}", param="text_2")
    return ScoreRequest(model=read_str(body, "model"), pairs=pairs)


def _texts(value: JsonValue, param: str) -> list[str]:
    if isinstance(value, str):
        return [_non_empty(value, param)]
    if not isinstance(value, list) or not value:
        raise invalid(f"'{param}' must be a string or a non-empty array of strings", param=param)
    return [_non_empty(as_str(item, f"{param}[{i}]"), f"{param}[{i}]") for i, item in enumerate(value)]


def rerank_body(
    scores: Scores, documents: list[str], *, id: str, model: str, top_n: int | None, return_documents: bool
) -> JsonObject:
    ranked = sorted(range(len(scores.scores)), key=lambda i: -scores.scores[i])[:top_n]
    results: list[JsonValue] = []
    for i in ranked:
        result: JsonObject = {"index": i, "relevance_score": scores.scores[i]}
        if return_documents:
            result["document"] = {"text": documents[i]}
        results.append(result)
    return {"id": id, "model": model, "usage": {"total_tokens": scores.prompt_tokens}, "results": results}


def score_body(scores: Scores, *, id: str, model: str, created: int) -> JsonObject:
    data: list[JsonValue] = [{"index": i, "object": "score", "score": score} for i, score in enumerate(scores.scores)]
    usage: JsonObject = {
        "prompt_tokens": scores.prompt_tokens,
        "total_tokens": scores.prompt_tokens,
        "completion_tokens": 0,
    }
    return {"id": id, "object": "list", "created": created, "model": model, "data": data, "usage": usage}
