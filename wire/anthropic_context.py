"""Anthropic context management: the `context_management` field ↔ context edits.

`read_context_management` decodes the two history edits Anthropic
documents (`clear_thinking_20251015`, `clear_tool_uses_20250919`) with
their defaults; `applied_edits_body` reports what they removed, in the
shape of the response's `context_management` field. Server-side
compaction (`compact_20260112`) needs a model call of its own and is
refused by name.
"""

from __future__ import annotations

from pipeline.errors import invalid, unsupported
from pipeline.requests import AppliedEdit, ClearThinking, ClearToolUses, ContextEdit, JsonObject, JsonValue
from wire.field_reads import Body, as_list, as_object, as_str

_CLEAR_THINKING = "clear_thinking_20251015"
_CLEAR_TOOL_USES = "clear_tool_uses_20250919"


def read_context_management(body: Body) -> tuple[ContextEdit, ...]:
    raw = body.get("context_management")
    if raw is None:
        return ()
    config = as_object(raw, "context_management")
    edits = config.get("edits")
    if edits is None:
        return ()
    return tuple(
        _read_edit(item, f"context_management.edits.{i}")
        for i, item in enumerate(as_list(edits, "context_management.edits"))
    )


def applied_edits_body(applied: tuple[AppliedEdit, ...]) -> JsonObject:
    edits: list[JsonValue] = []
    for edit in applied:
        if isinstance(edit.edit, ClearThinking):
            edits.append(
                {
                    "type": _CLEAR_THINKING,
                    "cleared_thinking_turns": edit.cleared,
                    "cleared_input_tokens": edit.cleared_input_tokens,
                }
            )
        else:
            edits.append(
                {
                    "type": _CLEAR_TOOL_USES,
                    "cleared_tool_uses": edit.cleared,
                    "cleared_input_tokens": edit.cleared_input_tokens,
                }
            )
    return {"applied_edits": edits}


def _read_edit(value: JsonValue, param: str) -> ContextEdit:
    edit = as_object(value, param)
    kind = edit.get("type")
    if kind == _CLEAR_THINKING:
        return ClearThinking(keep_turns=_thinking_keep(edit.get("keep"), f"{param}.keep"))
    if kind == _CLEAR_TOOL_USES:
        return _clear_tool_uses(edit, param)
    if kind == "compact_20260112":
        raise unsupported(f"{param}.type")
    raise invalid(f"{param}.type: unknown context management edit {kind!r}", param=f"{param}.type")


def _thinking_keep(value: JsonValue, param: str) -> int | None:
    if value is None:
        return 1
    if value == "all" or (isinstance(value, dict) and value.get("type") == "all"):
        return None
    return _counted(value, "thinking_turns", param)


def _clear_tool_uses(edit: JsonObject, param: str) -> ClearToolUses:
    trigger = edit.get("trigger")
    trigger_tokens: int | None = 100_000
    trigger_uses: int | None = None
    if trigger is not None:
        kind = as_object(trigger, f"{param}.trigger").get("type")
        if kind == "tool_uses":
            trigger_tokens, trigger_uses = None, _counted(trigger, "tool_uses", f"{param}.trigger")
        else:
            trigger_tokens = _counted(trigger, "input_tokens", f"{param}.trigger")
    keep = edit.get("keep")
    clear_at_least = edit.get("clear_at_least")
    return ClearToolUses(
        trigger_tokens=trigger_tokens,
        trigger_tool_uses=trigger_uses,
        keep=3 if keep is None else _counted(keep, "tool_uses", f"{param}.keep"),
        clear_at_least=0
        if clear_at_least is None
        else _counted(clear_at_least, "input_tokens", f"{param}.clear_at_least"),
        exclude_tools=frozenset(_names(edit.get("exclude_tools"), f"{param}.exclude_tools")),
        clear_inputs=_clear_inputs(edit.get("clear_tool_inputs"), f"{param}.clear_tool_inputs"),
    )


def _counted(value: JsonValue, unit: str, param: str) -> int:
    """A `{"type": unit, "value": n}` object's n."""
    item = as_object(value, param)
    if item.get("type") != unit:
        raise invalid(f"{param}.type: must be '{unit}'", param=f"{param}.type")
    count = item.get("value")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise invalid(f"{param}.value: must be a non-negative integer", param=f"{param}.value")
    return count


def _names(value: JsonValue, param: str) -> list[str]:
    if value is None:
        return []
    return [as_str(name, f"{param}.{i}") for i, name in enumerate(as_list(value, param))]


def _clear_inputs(value: JsonValue, param: str) -> bool | frozenset[str]:
    if value is None or isinstance(value, bool):
        return bool(value)
    return frozenset(_names(value, param))
