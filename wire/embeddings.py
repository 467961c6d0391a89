"""OpenAI's `POST /v1/embeddings`: the request read into an `EmbeddingRequest`, the result as its body.

`input` is a string, an array of strings, an array of token ids, or an
array of arrays of token ids (OpenAI's four forms); every malformed part
is a 400 naming where it is (`input[3]`). `encoding_format` `base64` is
the float32 values' little-endian bytes, what the `openai` SDK asks for
by default and decodes back to the same floats.
"""

from __future__ import annotations

import base64
import struct

from pipeline.errors import invalid, quote, unsupported
from pipeline.requests import JsonObject, JsonValue
from pipeline.work_requests import EmbeddingRequest, Embeddings, EncodingFormat, Input
from wire.field_reads import as_body, read_int, read_str

# OpenAI's bound on inputs in one request.
MAX_INPUTS = 2048
# vLLM's extensions that would change the embedding; other unknown fields follow `wire/field_policy.py`.
_REFUSED = ("truncate_prompt_tokens", "normalize", "embed_dtype")


def decode_embeddings(value: JsonValue) -> EmbeddingRequest:
    body = as_body(value)
    for key in _REFUSED:
        if body.get(key) is not None:
            raise unsupported(key)
    read_str(body, "user")
    fmt = read_str(body, "encoding_format") or "float"
    try:
        encoding = EncodingFormat(fmt)
    except ValueError:
        raise invalid(
            f"'encoding_format' must be 'float' or 'base64', got {quote(fmt)}", param="encoding_format"
        ) from None
    return EmbeddingRequest(
        model=read_str(body, "model"),
        inputs=_read_inputs(body.get("input")),
        encoding_format=encoding,
        dimensions=read_int(body, "dimensions", minimum=1),
    )


def _read_inputs(value: JsonValue) -> tuple[Input, ...]:
    if value is None:
        raise invalid("'input' is required", param="input")
    if isinstance(value, str):
        return (_text(value, "input"),)
    if not isinstance(value, list):
        raise invalid("'input' must be a string, an array of strings, or an array of token arrays", param="input")
    if not value:
        raise invalid("'input' must not be empty", param="input")
    if len(value) > MAX_INPUTS:
        raise invalid(f"'input' may hold at most {MAX_INPUTS} items, got {len(value)}", param="input")
    if all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        return (_ids(value, "input"),)
    inputs: list[Input] = []
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if isinstance(item, str):
            inputs.append(_text(item, param))
        elif isinstance(item, list):
            inputs.append(_ids(item, param))
        else:
            raise invalid(f"'{param}' must be a string or an array of token ids, got {quote(item)}", param=param)
    return tuple(inputs)


def _text(value: str, param: str) -> str:
    if not value:
        raise invalid(f"'{param}' is an empty string, which has no embedding", param=param)
    return value


def _ids(value: list[JsonValue], param: str) -> tuple[int, ...]:
    if not value:
        raise invalid(f"'{param}' is an empty array of token ids", param=param)
    ids: list[int] = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise invalid(f"'{param}[{i}]' must be a non-negative integer token id, got {quote(item)}", param=param)
        ids.append(item)
    return tuple(ids)


def embeddings_body(result: Embeddings, *, model: str, encoding: EncodingFormat) -> JsonObject:
    data: list[JsonValue] = [
        {"object": "embedding", "index": i, "embedding": _encode(vector, encoding)}
        for i, vector in enumerate(result.vectors)
    ]
    usage: JsonObject = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _encode(vector: tuple[float, ...], encoding: EncodingFormat) -> JsonValue:
    if encoding is EncodingFormat.FLOAT:
        return list(vector)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
