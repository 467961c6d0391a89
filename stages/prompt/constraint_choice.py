"""Which grammar a request's output follows: the client's own constraint, a forced call in the
family's markup, or, under `auto`, free text or a response format beside calls held to their tools.

The constraint is measured here, before any grammar is built from it (`within_budget`);
`stages/prompt/constraints.py` compiles what this module chooses.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING

from pipeline.errors import invalid, quote
from pipeline.requests import (
    ChatRequest,
    Constraint,
    ConstraintKind,
    GenerationRequest,
    Tool,
    ToolChoice,
    ToolChoiceMode,
)
from stages.families.base import Family, NotCarried, lark_json
from stages.families.lazy import CannotHold, formatted_or_calls_grammar, lazy_call_grammar

if TYPE_CHECKING:
    from stages.models.loading import Tokenizer

# Building the lexer for n literal choices costs about n**1.5 (3,000: 0.2 s;
# 20,000: 4 s on a laptop core); a menu this long is a prompt's job.
MAX_CHOICES = 1024
# Grammar text (Lark, regex, a JSON schema as JSON, or what llguidance made of it).
MAX_GRAMMAR_CHARS = 64 * 1024


def within_budget(constraint: Constraint) -> None:
    spec, param = constraint.spec, constraint.param
    if constraint.kind is ConstraintKind.CHOICE and isinstance(spec, list) and len(spec) > MAX_CHOICES:
        raise invalid(f"'{param}' holds {len(spec)} choices; this server takes at most {MAX_CHOICES}", param=param)
    size = len(spec) if isinstance(spec, str) else len(json.dumps(spec))
    if size > MAX_GRAMMAR_CHARS:
        raise invalid(
            f"'{param}' is {size} characters long; this server compiles at most {MAX_GRAMMAR_CHARS}", param=param
        )


def needs_constraint(request: GenerationRequest) -> bool:
    return request.params.constraint is not None or _forces_tool(request) or _holds_free_calls(request)


def constraint_of(tokenizer: Tokenizer, family: Family, request: GenerationRequest) -> Constraint | None:
    """The grammar a request's output follows, if any.

    A forced call follows its tool's grammar whatever the response format
    says (the format governs text, and a forced turn writes none), as
    OpenAI's API does; under `auto`, a format and tools each govern the
    output they apply to (`formatted_or_calls_constraint`).
    """
    if isinstance(request, ChatRequest) and _forces_tool(request):
        return tool_call_constraint(
            tokenizer, family, request.tools, request.tool_choice, parallel=request.parallel_tool_calls
        )
    if isinstance(request, ChatRequest) and _calls_beside_format(request) and family.auto_calls:
        assert request.params.constraint is not None
        return formatted_or_calls_constraint(tokenizer, family, request, request.params.constraint)
    if isinstance(request, ChatRequest) and _holds_free_calls(request) and family.auto_calls:
        return free_call_constraint(tokenizer, family, request.tools)
    return request.params.constraint


def _holds_free_calls(request: GenerationRequest) -> bool:
    """Under `auto`, a call the model opens to a custom tool with a grammar must follow it."""
    return (
        isinstance(request, ChatRequest)
        and request.tool_choice.mode is ToolChoiceMode.AUTO
        and request.params.constraint is None
        and any(tool.input_grammar is not None or tool.strict for tool in request.tools)
    )


def _calls_beside_format(request: ChatRequest) -> bool:
    auto, text = request.tool_choice.mode is ToolChoiceMode.AUTO, request.params.constraint
    return auto and text is not None and not text.whole_output and bool(request.tools)


def formatted_or_calls_constraint(
    tokenizer: Tokenizer, family: Family, request: ChatRequest, text: Constraint
) -> Constraint:
    """Text held to the response format, or calls held to their tools' grammars.

    Raises:
        RequestError: the family cannot tell a call from text at its first token (gpt-oss's
            messages, an opener of several tokens), or a tool's grammar cannot be carried.
    """
    try:
        marker = partial(_marker, tokenizer)
        lark = formatted_or_calls_grammar(
            family, request.tools, marker, text=format_lark(text), parallel=request.parallel_tool_calls
        )
    except CannotHold as reason:
        raise invalid(
            f"'{text.param}' beside tools under tool_choice 'auto' cannot be enforced: {reason}, so the output "
            "cannot be held to the format while leaving the model free to call a tool; force a call "
            "(tool_choice 'required' or a named tool) or leave the tools out",
            param=text.param,
        ) from None
    except NotCarried as error:
        raise invalid(str(error), param=error.param) from None
    return Constraint(kind=ConstraintKind.GRAMMAR, spec=lark, param=text.param)


def free_call_constraint(tokenizer: Tokenizer, family: Family, tools: tuple[Tool, ...]) -> Constraint:
    """Free text with calls in it, each held to the family's markup, its tool's schema and grammar (`families/lazy.py`).

    Raises:
        RequestError: the family cannot hold a grammar under `auto`, or a tool's grammar cannot be carried.
    """
    held = next(tool for tool in tools if tool.input_grammar is not None or tool.strict)
    param = held.input_grammar.param if held.input_grammar is not None else "tools"
    what = "grammar" if held.input_grammar is not None else "schema (strict)"
    try:
        lark = lazy_call_grammar(family, tools, partial(_marker, tokenizer), end_ids=sorted(tokenizer.eos_token_ids))
    except CannotHold as reason:
        raise invalid(
            f"Invalid '{param}': {reason}, so a call to {held.name!r} the model opens under tool_choice 'auto' cannot "
            f"be held to the tool's {what}; name the tool in tool_choice, or offer it without a "
            + ("grammar" if held.input_grammar is not None else "'strict: true'"),
            param=param,
        ) from None
    except NotCarried as error:
        raise invalid(str(error), param=error.param) from None
    return Constraint(kind=ConstraintKind.GRAMMAR, spec=lark, param=param)


def format_lark(constraint: Constraint) -> str:
    """A response format's constraint as one Lark expression, to sit beside calls in a grammar."""
    within_budget(constraint)
    spec = constraint.spec
    if constraint.kind is ConstraintKind.JSON_SCHEMA:
        return lark_json(spec if isinstance(spec, dict) else {})
    if constraint.kind is ConstraintKind.REGEX:
        return "/" + str(spec).replace("/", "\\/") + "/"
    if constraint.kind is ConstraintKind.CHOICE:
        choices = spec if isinstance(spec, list) else [spec]
        return "(" + " | ".join(json.dumps(str(choice)) for choice in choices) + ")"
    return "%lark {\n" + str(spec) + "\n}"


def _forces_tool(request: GenerationRequest) -> bool:
    return isinstance(request, ChatRequest) and request.tool_choice.mode in (
        ToolChoiceMode.REQUIRED,
        ToolChoiceMode.NAMED,
    )


def tool_call_constraint(
    tokenizer: Tokenizer, family: Family, tools: tuple[Tool, ...], choice: ToolChoice, *, parallel: bool = True
) -> Constraint:
    """A grammar that makes the model write a call to an allowed tool.

    It follows the family's own markup (`stages/families/`), so the sink
    parses the call as if the model had chosen it; a model with no call
    markup writes the call's JSON alone (for `required`, a list of calls
    unless `parallel` is false: the client wants one call).

    Raises:
        RequestError: the family's calls cannot be forced, or the named tool is not among `tools`.
    """
    allowed = tools if choice.mode is ToolChoiceMode.REQUIRED else tuple(t for t in tools if t.name == choice.name)
    if not allowed:
        raise invalid(f"tool_choice names {quote(choice.name)}, which is not among the tools", param="tool_choice")
    several = family.forced_required if parallel else None
    grammar = several if choice.mode is ToolChoiceMode.REQUIRED and several is not None else family.forced
    try:
        lark = grammar(allowed, partial(_marker, tokenizer))
    except NotImplementedError as reason:
        raise invalid(
            f"tool_choice {choice.mode.value!r} cannot be enforced in this model's tool-call markup: {reason}",
            param="tool_choice",
        ) from None
    except NotCarried as error:
        raise invalid(str(error), param=error.param) from None
    return Constraint(kind=ConstraintKind.GRAMMAR, spec=lark, param="tool_choice")


def _marker(tokenizer: Tokenizer, text: str) -> str:
    """A marker in Lark: by token id when it is one added token, which
    llguidance matches as a token rather than as its text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return f"<[{ids[0]}]>" if len(ids) == 1 else json.dumps(text)
