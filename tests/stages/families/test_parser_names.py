"""The parser names the settings take are the families' own (pipeline/ cannot import them, so it spells them out)."""

from __future__ import annotations

from pipeline.settings import REASONING_PARSER_NAMES, TOOL_PARSER_NAMES
from stages.families import THINK_MARKERS, TOOL_PARSERS


def test_every_family_is_a_tool_parser_setting_and_no_other() -> None:
    assert sorted(TOOL_PARSER_NAMES) == sorted(TOOL_PARSERS)


def test_every_think_marker_is_a_reasoning_parser_setting_and_no_other() -> None:
    assert sorted(REASONING_PARSER_NAMES) == sorted(THINK_MARKERS)
