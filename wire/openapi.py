"""The OpenAPI 3.1 description served at `GET /openapi.json`.

Routes are listed here once, each POST with its decoder and one small body
the decoder accepts; the request schemas are probed from the decoders
(`wire.schema_probe`), never written by hand. A test checks that every
route the app serves is described here and nothing else is.
"""

from __future__ import annotations

import functools

import attrs

from pipeline.requests import JsonObject, JsonValue
from wire.anthropic_requests import decode_count_tokens, decode_messages
from wire.embeddings import decode_embeddings
from wire.openai_requests import decode_chat, decode_completion
from wire.responses_requests import decode_responses
from wire.schema_probe import Decoder, body_schema
from wire.scoring import decode_rerank, decode_score
from wire.transcriptions import audio_form
from wire.vllm_tokenize import decode_detokenize, decode_tokenize

_USER: list[JsonValue] = [{"role": "user", "content": "Hello"}]


# (method, path, summary) of the routes whose bodies are files, lines or another API's own shapes.
_WORK_LATER = (
    ("get", "/v1/files", "OpenAI Files: the uploaded files"),
    ("post", "/v1/files", "OpenAI Files: upload a JSONL file for a batch (multipart)"),
    ("get", "/v1/files/{file_id}", "OpenAI Files: a file"),
    ("delete", "/v1/files/{file_id}", "OpenAI Files: delete a file"),
    ("get", "/v1/files/{file_id}/content", "OpenAI Files: a file's content"),
    ("get", "/v1/batches", "OpenAI Batch: the batches, a page"),
    ("post", "/v1/batches", "OpenAI Batch: run a file of requests beneath live traffic"),
    ("get", "/v1/batches/{batch_id}", "OpenAI Batch: a batch"),
    ("post", "/v1/batches/{batch_id}/cancel", "OpenAI Batch: cancel a batch"),
)
_MESSAGE_BATCHES = (
    ("get", "/v1/messages/batches", "Anthropic Message Batches: a page"),
    ("post", "/v1/messages/batches", "Anthropic Message Batches: create"),
    ("get", "/v1/messages/batches/{batch_id}", "Anthropic Message Batches: a batch"),
    ("delete", "/v1/messages/batches/{batch_id}", "Anthropic Message Batches: delete a finished batch"),
    ("get", "/v1/messages/batches/{batch_id}/results", "Anthropic Message Batches: results as JSONL"),
    ("post", "/v1/messages/batches/{batch_id}/cancel", "Anthropic Message Batches: cancel"),
)
_OLLAMA = (
    ("post", "/api/chat", "Ollama chat (NDJSON stream)"),
    ("post", "/api/generate", "Ollama generate (NDJSON stream)"),
    ("post", "/api/embed", "Ollama embeddings"),
    ("post", "/api/embeddings", "Ollama embeddings, the older route"),
    ("get", "/api/tags", "Ollama: the models"),
    ("post", "/api/show", "Ollama: a model's template, parameters and capabilities"),
    ("get", "/api/ps", "Ollama: the loaded models"),
    ("get", "/api/version", "Ollama: the version"),
    ("post", "/api/pull", "Ollama: fetch a model into the cache, its progress as NDJSON"),
    ("delete", "/api/delete", "Ollama: remove a model from the cache"),
)


@attrs.frozen(kw_only=True)
class Operation:
    method: str
    path: str
    summary: str
    # Anthropic routes answer errors in Anthropic's shape, Ollama's in its own.
    anthropic: bool = False
    ollama: bool = False
    decode: Decoder | None = None
    example: JsonObject | None = None
    # True when `stream: true` turns the answer into server-sent events.
    streams: bool = False
    public: bool = False
    # What a 200 carries, when not JSON.
    content_type: str = "application/json"
    # A multipart form's schema (the audio routes), written out: their decoder reads a form, not JSON.
    form: JsonObject | None = None


OPERATIONS = (
    Operation(
        method="post",
        path="/v1/chat/completions",
        summary="OpenAI Chat Completions",
        decode=decode_chat,
        example={
            "model": "m",
            "messages": _USER,
            "max_tokens": 1,
            "tool_choice": "auto",
            "reasoning_effort": "low",
            "response_format": {"type": "json_object"},
        },
        streams=True,
    ),
    Operation(
        method="post",
        path="/v1/completions",
        summary="OpenAI Completions (legacy)",
        decode=decode_completion,
        example={"model": "m", "prompt": "Hello", "max_tokens": 1},
        streams=True,
    ),
    Operation(
        method="post",
        path="/v1/responses",
        summary="OpenAI Responses",
        decode=decode_responses,
        example={
            "model": "m",
            "input": [{"type": "message", "role": "user", "content": "Hello"}],
            "max_output_tokens": 1,
        },
        streams=True,
    ),
    Operation(method="get", path="/v1/responses/{response_id}", summary="A stored response"),
    Operation(method="delete", path="/v1/responses/{response_id}", summary="Delete a stored response"),
    Operation(method="get", path="/v1/responses/{response_id}/input_items", summary="A stored response's input items"),
    Operation(
        method="post",
        path="/v1/messages",
        summary="Anthropic Messages",
        anthropic=True,
        decode=decode_messages,
        example={"model": "m", "messages": _USER, "max_tokens": 1},
        streams=True,
    ),
    Operation(
        method="post",
        path="/v1/messages/count_tokens",
        summary="Anthropic token counting",
        anthropic=True,
        decode=decode_count_tokens,
        example={"model": "m", "messages": _USER},
    ),
    Operation(
        method="post",
        path="/v1/embeddings",
        summary="OpenAI Embeddings",
        decode=decode_embeddings,
        example={"model": "m", "input": ["Hello"], "encoding_format": "float"},
    ),
    *(
        Operation(
            method="post",
            path=path,
            summary="Rerank documents against a query (Jina/Cohere shape)",
            decode=decode_rerank,
            example={"model": "m", "query": "Hello", "documents": ["Hi"], "top_n": 1},
        )
        for path in ("/v1/rerank", "/rerank")
    ),
    *(
        Operation(
            method="post",
            path=path,
            summary="Relevance scores of text pairs (vLLM)",
            decode=decode_score,
            example={"model": "m", "text_1": "Hello", "text_2": ["Hi"]},
        )
        for path in ("/v1/score", "/score")
    ),
    Operation(
        method="post",
        path="/tokenize",
        summary="Tokenize a prompt or a chat (vLLM)",
        decode=decode_tokenize,
        example={"model": "m", "prompt": "Hello", "add_special_tokens": True},
    ),
    Operation(
        method="post",
        path="/detokenize",
        summary="Text of token ids (vLLM)",
        decode=decode_detokenize,
        example={"model": "m", "tokens": [1]},
    ),
    Operation(
        method="post",
        path="/v1/audio/transcriptions",
        summary="OpenAI audio transcriptions (speech to text)",
        form=audio_form(translations=False),
    ),
    Operation(
        method="post",
        path="/v1/audio/translations",
        summary="OpenAI audio translations (speech to English text)",
        form=audio_form(translations=True),
    ),
    Operation(method="get", path="/v1/models", summary="The served models, as a list (several: states, defaults)"),
    Operation(method="get", path="/v1/models/{model_id}", summary="A served model"),
    Operation(
        method="get", path="/health", summary="Liveness: 200 while the engine serves, 503 otherwise", public=True
    ),
    Operation(method="get", path="/fit", summary="What this machine can serve of this model"),
    Operation(method="get", path="/stats", summary="Live counters of every stage"),
    Operation(method="get", path="/metrics", summary="Prometheus metrics: vLLM's names, and mlx_relay: ones"),
    Operation(method="get", path="/v1/loads", summary="Load in the shape SGLang serves and smg polls"),
    Operation(method="get", path="/openapi.json", summary="This description"),
    Operation(
        method="get",
        path="/v1/responses",
        summary="The Responses API over WebSocket (send Upgrade: websocket; a plain GET is 426)",
    ),
    Operation(method="get", path="/", summary="The chat page", public=True, content_type="text/html"),
    Operation(
        method="get",
        path="/assets/{name}",
        summary="The chat page's files, by hashed name",
        public=True,
        content_type="text/javascript",
    ),
    *(
        Operation(method="post", path=f"/admin/models/{{name}}/{action}", summary=summary)
        for action, summary in (
            ("load", "Load a configured model now"),
            ("unload", "Unload a model now (its requests in flight fail)"),
            ("drain", "Unload a model once its requests in flight finish"),
        )
    ),
    Operation(method="post", path="/v1/responses/{response_id}/cancel", summary="Cancel a background response"),
    Operation(method="post", path="/v1/models/pull", summary="Fetch a model into the cache, its progress as SSE"),
    *(Operation(method=method, path=path, summary=summary) for method, path, summary in _WORK_LATER),
    *(
        Operation(method=method, path=path, summary=summary, anthropic=True)
        for method, path, summary in _MESSAGE_BATCHES
    ),
    *(Operation(method=method, path=path, summary=summary, ollama=True) for method, path, summary in _OLLAMA),
)


@functools.cache
def document(version: str = "0.1.0") -> JsonObject:
    """The whole description; probing the decoders takes a few hundred decodes, so it is built once."""
    paths: JsonObject = {}
    for operation in OPERATIONS:
        item = paths.setdefault(operation.path, {})
        assert isinstance(item, dict)
        item[operation.method] = _operation(operation)
    return {
        "openapi": "3.1.0",
        "info": {"title": "mlx-relay", "version": version},
        "paths": paths,
        "components": {
            "schemas": {"OpenAIError": _OPENAI_ERROR, "AnthropicError": _ANTHROPIC_ERROR, "OllamaError": _OLLAMA_ERROR},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        # Only when MLX_RELAY_API_KEY is set; an unset key leaves every route open.
        "security": [{"bearer": []}, {"apiKey": []}, {}],
    }


def _operation(operation: Operation) -> JsonObject:
    shape = "AnthropicError" if operation.anthropic else "OllamaError" if operation.ollama else "OpenAIError"
    error: JsonObject = {"$ref": "#/components/schemas/" + shape}
    error_response: JsonObject = {"description": "An error", "content": {"application/json": {"schema": error}}}
    json_body = operation.content_type == "application/json"
    ok: JsonObject = {operation.content_type: {"schema": {"type": "object" if json_body else "string"}}}
    if operation.path == "/metrics":
        ok = {"text/plain": {"schema": {"type": "string"}}}
    if operation.streams:
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    described: JsonObject = {
        "summary": operation.summary,
        "operationId": f"{operation.method}_{_operation_path(operation.path)}",
        "responses": {"200": {"description": "Success", "content": ok}, "4XX": error_response, "5XX": error_response},
    }
    parameters: list[JsonValue] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _path_parameters(operation.path)
    ]
    if parameters:
        described["parameters"] = parameters
    if operation.public:
        described["security"] = []
    if operation.form is not None:
        described["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": operation.form}}}
    if operation.decode is not None and operation.example is not None:
        schema = body_schema(operation.decode, operation.example)
        described["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    return described


def _operation_path(path: str) -> str:
    """`/v1/responses/{response_id}` as `v1_responses_response_id`: the path part of an operationId."""
    return path.strip("/").replace("/", "_").replace("{", "").replace("}", "")


def _path_parameters(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{") and part.endswith("}")]


_NULLABLE_STRING: JsonObject = {"type": ["string", "null"]}
_OPENAI_ERROR: JsonObject = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": _NULLABLE_STRING,
                "code": _NULLABLE_STRING,
            },
        }
    },
}
_ANTHROPIC_ERROR: JsonObject = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_OLLAMA_ERROR: JsonObject = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
