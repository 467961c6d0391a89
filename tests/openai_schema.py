"""Validation against OpenAI's published response schemas (tests/fixtures/openai_openapi, pinned).

OpenAPI 3.1's schemas are JSON Schema 2020-12; `$ref`s resolve against the document itself. The document
still marks fields OpenAI sends as null with OpenAPI 3.0's `nullable: true`, which 2020-12 does not know;
each is read as what it means (the schema, or null).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMAS = Path(__file__).parent / "fixtures" / "openai_openapi" / "schemas.json"


@functools.cache
def _document() -> dict[str, Any]:
    document: dict[str, Any] = _nullable(json.loads(SCHEMAS.read_text()))
    return document


def _nullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_nullable(value) for value in node]
    if not isinstance(node, dict):
        return node
    schema = {key: _nullable(value) for key, value in node.items() if key != "nullable"}
    return {"anyOf": [schema, {"type": "null"}]} if node.get("nullable") is True else schema


@functools.cache
def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator({**_document(), "$ref": f"#/components/schemas/{name}"})


def problems(name: str, instance: object) -> list[str]:
    """What in `instance` breaks the schema `name`; empty when it validates."""
    errors = validator(name).iter_errors(instance)
    return [f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message[:300]}" for error in errors]


def assert_valid(name: str, instance: object) -> None:
    found = problems(name, instance)
    assert not found, (name, found, json.dumps(instance)[:2000])


@functools.cache
def _event_schemas() -> dict[str, str]:
    """Each Responses stream event's type, and the name of its schema in `ResponseStreamEvent`'s union."""
    schemas = _document()["components"]["schemas"]
    names = [option["$ref"].rsplit("/", 1)[1] for option in schemas["ResponseStreamEvent"]["anyOf"]]
    return {kind: name for name in names for kind in schemas[name]["properties"]["type"].get("enum", [])}


def assert_valid_event(event: dict[str, Any]) -> None:
    """A Responses stream event: of a type the union knows, valid under that type's own schema (whose errors say
    more than the union's "not valid under any")."""
    name = _event_schemas().get(event.get("type"))  # type: ignore[arg-type]
    assert name is not None, f"unknown stream event type {event.get('type')!r}"
    assert_valid(name, event)


def completion_chunk_as_body(chunk: dict[str, Any]) -> dict[str, Any]:
    """A legacy Completions stream chunk, read as the body schema the document gives its chunks ("the same as
    the body"): OpenAI's chunks carry `finish_reason` and `usage` null until the last, which that schema has
    no room for; those two nulls are the only departure allowed."""
    choices = [{**choice, "finish_reason": choice["finish_reason"] or "stop"} for choice in chunk["choices"]]
    body = {**chunk, "choices": choices}
    if body.get("usage", 0) is None:
        del body["usage"]
    return body
