"""The probe reads a decoder's fields, types and required set off the decoder itself."""

from __future__ import annotations

import pytest

from pipeline.errors import invalid
from pipeline.requests import JsonValue
from wire.field_reads import as_body, as_list, as_object, as_str, read_bool, read_int
from wire.openapi import OPERATIONS, document
from wire.schema_probe import body_schema


def toy(value: JsonValue) -> object:
    body = as_body(value)
    name = as_str(body.get("name"), "name")
    count = read_int(body, "count", minimum=0)
    if body.get("legacy") is not None:
        raise invalid("'legacy' is not supported", param="legacy")
    items = [as_object(item, f"items[{i}]") for i, item in enumerate(as_list(body.get("items", []), "items"))]
    flags = [read_bool(item, "flag") for item in items]
    return name, count, flags


def test_fields_types_and_required_come_from_the_decoder() -> None:
    schema = body_schema(toy, {"name": "a", "items": [{"flag": True}]})
    assert schema == {
        "type": "object",
        "properties": {
            # Every body's `model` is read by `as_body` itself.
            "model": {"type": ["string", "null"]},
            "name": {"type": "string"},
            "count": {"type": ["integer", "null"]},
            "legacy": {"type": "null"},
            "items": {
                # Absent is fine, but an explicit null is refused (`as_list`), and the probe sees that.
                "type": "array",
                "items": {"type": "object", "properties": {"flag": {"type": ["boolean", "null"]}}},
            },
        },
        "required": ["name"],
    }


def test_an_example_the_decoder_refuses_is_a_bug_in_the_table() -> None:
    with pytest.raises(ValueError, match="refused"):
        body_schema(toy, {"count": 1})


@pytest.mark.parametrize("operation", [op for op in OPERATIONS if op.decode is not None], ids=lambda op: op.path)
def test_every_described_body_is_accepted_by_its_decoder(operation: object) -> None:
    """The table's examples are valid, so each schema is probed from a body the route takes."""
    described = document()["paths"]
    assert isinstance(described, dict)
    item = described[operation.path]  # type: ignore[attr-defined]
    assert isinstance(item, dict) and "requestBody" in item["post"]
