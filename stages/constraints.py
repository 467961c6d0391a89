"""Structured outputs: constraints compiled into llguidance grammars.

A `Constraint` (what the client asked for: a JSON schema, a regex, a
choice, a Lark grammar, or "call one of these tools") becomes an
llguidance grammar, which is validated against the model's tokenizer and
compiled into an `LLMatcher` prototype. Compiling runs in the preparation
executor under its own reservation, never on the event loop; compiled
prototypes are cached by grammar text, and each row gets a deep copy for
the model thread (`stages/sampling.py` applies its token mask).
On error: an invalid schema, regex or grammar is a `RequestError` (400)
that names the field and quotes llguidance's message.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import attrs

from pipeline.errors import invalid
from pipeline.requests import ChatRequest, Constraint, ConstraintKind, GenerationRequest, Tool, ToolChoice, ToolChoiceMode
from stages.models.mlx_internals import hf_tokenizer, is_json_tool_parser

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLTokenizer
    from llguidance._lib import JsonCompileOptions

    from stages.models.loading import Tokenizer

# Compiled grammars kept for reuse; a schema's compile can cost milliseconds.
_CACHE_ENTRIES = 128
# JSON as clients expect to read it, with no room for runs of whitespace:
# a model may otherwise spend its whole budget on newlines.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@attrs.define
class CompiledConstraint:
    """A validated grammar; `matcher()` gives a fresh matcher for one row."""

    _prototype: LLMatcher = attrs.field(alias="prototype")

    def matcher(self) -> LLMatcher:
        return self._prototype.deep_copy()


@attrs.define
class ConstraintCompiler:
    """Turns constraints into matchers for one model; thread-safe."""

    _tokenizer: Tokenizer = attrs.field(alias="tokenizer")
    _vocab_size: int = attrs.field(alias="vocab_size")
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _ll_tokenizer: LLTokenizer | None = attrs.field(default=None, init=False)
    _compiled: OrderedDict[str, CompiledConstraint] = attrs.field(factory=OrderedDict, init=False)

    def compile_for(self, request: GenerationRequest) -> CompiledConstraint | None:
        """The compiled constraint of `request`, if it has one.

        Raises:
            RequestError: the constraint is invalid, or the tool choice cannot be enforced.
        """
        constraint = constraint_of(self._tokenizer, request)
        return None if constraint is None else self.compile(constraint)

    def compile(self, constraint: Constraint) -> CompiledConstraint:
        """Raises: RequestError: the constraint is not a valid grammar."""
        from llguidance import LLMatcher

        grammar = self._grammar(constraint)
        with self._lock:
            cached = self._compiled.get(grammar)
            if cached is not None:
                self._compiled.move_to_end(grammar)
                return cached
        # Building the matcher is the compile; an invalid grammar leaves it in error.
        matcher = LLMatcher(self._llguidance_tokenizer(), grammar)
        if matcher.is_error():
            raise invalid(f"Invalid {constraint.param}: {matcher.get_error().strip()}", param=constraint.param)
        compiled = CompiledConstraint(prototype=matcher)
        with self._lock:
            self._compiled[grammar] = compiled
            while len(self._compiled) > _CACHE_ENTRIES:
                self._compiled.popitem(last=False)
        return compiled

    def _grammar(self, constraint: Constraint) -> str:
        from llguidance import LLMatcher

        spec, kind = constraint.spec, constraint.kind
        try:
            if kind is ConstraintKind.JSON_SCHEMA:
                return str(LLMatcher.grammar_from_json_schema(json.dumps(spec), defaults=_JSON_OPTIONS))
            if kind is ConstraintKind.REGEX:
                return str(LLMatcher.grammar_from_regex(str(spec)))
            if kind is ConstraintKind.CHOICE:
                choices = spec if isinstance(spec, list) else [spec]
                return str(LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(str(c)) for c in choices)))
            return str(LLMatcher.grammar_from_lark(str(spec)))
        except (ValueError, TypeError) as error:
            raise invalid(f"Invalid {constraint.param}: {error}", param=constraint.param) from None

    def _llguidance_tokenizer(self) -> LLTokenizer:
        # Built once, on first use: it walks the whole vocabulary (about a second for large ones).
        with self._lock:
            if self._ll_tokenizer is None:
                from llguidance.hf import from_tokenizer

                # mlx-lm's wrapper keeps the Hugging Face tokenizer llguidance reads.
                hf = hf_tokenizer(self._tokenizer)
                eos = sorted(self._tokenizer.eos_token_ids)
                self._ll_tokenizer = from_tokenizer(hf, n_vocab=self._vocab_size, eos_token=eos)
            return self._ll_tokenizer


def needs_constraint(request: GenerationRequest) -> bool:
    return request.params.constraint is not None or _forces_tool(request)


def constraint_of(tokenizer: Tokenizer, request: GenerationRequest) -> Constraint | None:
    if isinstance(request, ChatRequest) and _forces_tool(request):
        if request.params.constraint is not None:
            raise invalid("A forced tool call and a response format cannot both constrain one output", param="tool_choice")
        return tool_call_constraint(tokenizer, request.tools, request.tool_choice)
    return request.params.constraint


def _forces_tool(request: GenerationRequest) -> bool:
    return isinstance(request, ChatRequest) and request.tool_choice.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED)


def tool_call_constraint(tokenizer: Tokenizer, tools: tuple[Tool, ...], choice: ToolChoice) -> Constraint:
    """A grammar that makes the model write exactly one call to an allowed tool.

    It follows the model's own markup, so the sink parses the call as if
    the model had chosen it: `<start>{"name": ..., "arguments": {...}}<end>`.

    Raises:
        RequestError: the model's tool-call markup is not JSON between markers,
            or the named tool is not among `tools`.
    """
    start, end = tokenizer.tool_call_start, tokenizer.tool_call_end
    if not start or not end or not _json_markup(tokenizer):
        raise invalid("tool_choice 'required' needs a model whose tool calls are JSON between markers", param="tool_choice")
    allowed = tools if choice.mode is ToolChoiceMode.REQUIRED else tuple(t for t in tools if t.name == choice.name)
    if not allowed:
        raise invalid(f"tool_choice names {choice.name!r}, which is not among the tools", param="tool_choice")
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": tool.parameters or {"type": "object"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in allowed
    ]
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": dict(_JSON_OPTIONS)}
    lark = f"start: {_marker(tokenizer, start)} {json.dumps(chr(10))} %json {json.dumps(schema)} {json.dumps(chr(10))} {_marker(tokenizer, end)}"
    return Constraint(kind=ConstraintKind.GRAMMAR, spec=lark, param="tool_choice")


def _marker(tokenizer: Tokenizer, text: str) -> str:
    """A marker in Lark: by token id when it is one added token, which
    llguidance matches as a token rather than as its text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return f"<[{ids[0]}]>" if len(ids) == 1 else json.dumps(text)


def _json_markup(tokenizer: Tokenizer) -> bool:
    return is_json_tool_parser(tokenizer.tool_parser)
