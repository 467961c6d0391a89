"""Structured outputs: constraints compiled into llguidance grammars.

A `Constraint` (what the client asked for: a JSON schema, a regex, a
choice, a Lark grammar, or "call one of these tools") becomes an
llguidance grammar, which is validated against the model's tokenizer and
compiled into an `LLMatcher` prototype. Compiling runs in the preparation
executor under its own reservation, never on the event loop; compiled
prototypes are cached by grammar text, and each row gets a deep copy for
the model thread (`stages/model_thread/sampling.py` applies its token mask).
Which constraint a request gets is `stages/prompt/constraint_choice.py`'s; it also
measures it before llguidance sees it (choices, grammar text). A grammar compiles
under `LLParserLimits` tighter than llguidance's defaults; a grammar past
`LARGE_GRAMMAR_CHARS` compiles under a reservation of its own
(`PrepKind.CONSTRAIN_LARGE`, `stages/prompt/prepare.py`), so one costly grammar
never holds the slot the cheap ones use.
On error: an invalid or oversized schema, regex or grammar is a
`RequestError` (400) that names the field and gives llguidance's reason
in a bounded excerpt (`stages/grammar_faults.py`, which the sink words a
fault mid-generation with too), never a Rust panic or backtrace. llguidance builds
much of a grammar lazily, on the first masks, so a compile also walks a
few tokens down the grammar (`_walk_fault`): a grammar that matches
nothing or hits a parser or lexer limit there is refused at once rather
than ending a row with `stop` and text that breaks it. A limit met later,
mid-generation, fails that row (`stages/model_thread/sampling.py`'s
`ConstraintProcessor` records it, the sink ends the row with an error).
llguidance is kept silent (`log_level=0`: it writes warnings to stderr);
its warnings and errors go to the structured log here.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs
import structlog

from pipeline.errors import invalid
from pipeline.requests import Constraint, ConstraintKind, GenerationRequest
from stages.families import choose_family
from stages.families.base import Family
from stages.grammar_faults import LEXER_FUEL, plain_reason
from stages.messages import CompiledConstraint, Grammar
from stages.models.mlx_internals import hf_tokenizer
from stages.prompt.constraint_choice import MAX_GRAMMAR_CHARS, constraint_of, within_budget

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLParserLimits, LLTokenizer
    from llguidance._lib import JsonCompileOptions

    from stages.models.loading import Tokenizer

log = structlog.get_logger(stage="constraints")

# Compiled grammars kept for reuse; a schema's compile can cost milliseconds.
_CACHE_ENTRIES = 128
# Tokens a compile walks down the grammar: the limits the cases hit show on the first.
_WALK_TOKENS = 4


# JSON as clients expect to read it, with no room for runs of whitespace:
# a model may otherwise spend its whole budget on newlines.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@attrs.define
class ConstraintCompiler:
    """Turns constraints into matchers for one model; thread-safe."""

    _tokenizer: Tokenizer = attrs.field(alias="tokenizer")
    _vocab_size: int = attrs.field(alias="vocab_size")
    # The model's markup, for forced tool calls; chosen from the tokenizer when not given.
    _family: Family | None = attrs.field(default=None, alias="family")
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _ll_tokenizer: LLTokenizer | None = attrs.field(default=None, init=False)
    _compiled: OrderedDict[str, CompiledConstraint] = attrs.field(factory=OrderedDict, init=False)

    def grammar_for(self, request: GenerationRequest) -> Grammar | None:
        """The grammar of `request`'s constraint, if it has one; cheap next to compiling it.

        Raises:
            RequestError: the constraint is invalid or over budget, or the tool choice cannot be enforced.
        """
        if self._family is None:
            self._family = choose_family(self._tokenizer)
        constraint = constraint_of(self._tokenizer, self._family, request)
        return None if constraint is None else grammar_of(constraint)

    def compile(self, constraint: Constraint) -> CompiledConstraint:
        """Raises: RequestError: the constraint is not a valid grammar, or is over budget."""
        return self.compile_grammar(grammar_of(constraint))

    def compile_grammar(self, grammar: Grammar) -> CompiledConstraint:
        """Raises: RequestError: the grammar does not compile within the limits."""
        from llguidance import LLMatcher

        with self._lock:
            cached = self._compiled.get(grammar.text)
            if cached is not None:
                self._compiled.move_to_end(grammar.text)
                return attrs.evolve(cached, param=grammar.param)
        # Building the matcher is the compile; an invalid grammar leaves it in error.
        matcher = LLMatcher(self._llguidance_tokenizer(), grammar.text, log_level=0, limits=_limits())
        if warnings := matcher.get_grammar_warnings():
            log.warning(
                "constraint.grammar_warnings", param=grammar.param, warnings=[plain_reason(w) for w in warnings[:8]]
            )
        fault = matcher.get_error() if matcher.is_error() else _walk_fault(matcher, self._tokenizer.eos_token_ids)
        if fault:
            log.info("constraint.refused", param=grammar.param, reason=plain_reason(fault))
            raise invalid(
                f"Invalid '{grammar.param}': {plain_reason(fault)}", param=grammar.param, code="invalid_grammar"
            )
        compiled = CompiledConstraint(prototype=matcher, param=grammar.param, grammar=grammar)
        with self._lock:
            self._compiled[grammar.text] = compiled
            while len(self._compiled) > _CACHE_ENTRIES:
                self._compiled.popitem(last=False)
        return compiled

    def warm(self) -> None:
        """Build the llguidance tokenizer now, so the first constrained row does not wait for it; blocking.

        A tokenizer llguidance cannot read is left unbuilt, for the first constrained row to fail on as before.
        """
        try:
            self._llguidance_tokenizer()
        except (ValueError, RuntimeError) as error:
            log.warning("constraint.tokenizer_unbuilt", reason=str(error))

    def _llguidance_tokenizer(self) -> LLTokenizer:
        # Built once, on first use or by `warm`: it walks the whole vocabulary (about a second for large ones).
        with self._lock:
            if self._ll_tokenizer is None:
                from llguidance.hf import from_tokenizer

                # mlx-lm's wrapper keeps the Hugging Face tokenizer llguidance reads.
                hf = hf_tokenizer(self._tokenizer)
                eos = sorted(self._tokenizer.eos_token_ids)
                self._ll_tokenizer = from_tokenizer(hf, n_vocab=self._vocab_size, eos_token=eos)
            return self._ll_tokenizer


def _limits() -> LLParserLimits:
    from llguidance import LLParserLimits

    # Fuel and sizes below llguidance's defaults (1M lexer fuel, 500k
    # symbols, 250k lexer states): room for any grammar under
    # MAX_GRAMMAR_CHARS that clients write, and a fast error for one that
    # explodes. Errors name no parser state or grammar internals.
    return LLParserLimits(
        initial_lexer_fuel=LEXER_FUEL, max_grammar_size=100_000, max_lexer_states=50_000, verbose_errors=False
    )


def _walk_fault(prototype: LLMatcher, eos_ids: Iterable[int]) -> str | None:
    """llguidance's error met walking a few tokens down a fresh copy of the grammar, if any.

    The walk takes the lowest token each mask allows (not an end): the
    first steps build the lexer and the parser's first rows, where a
    grammar that matches nothing, a row past `max_items_in_row` or a
    regex past the lexer's fuel show. It costs a mask per token.
    """
    import numpy as np

    walker, ends = prototype.deep_copy(), set(eos_ids)
    for _ in range(_WALK_TOKENS):
        words = np.frombuffer(walker.compute_bitmask(), dtype=np.uint8)
        allowed = np.flatnonzero(np.unpackbits(words, bitorder="little"))
        if walker.is_error():
            return walker.get_error()
        token = next((int(t) for t in allowed if int(t) not in ends), None)
        if token is None:
            return None
        if not walker.consume_token(token):
            return walker.get_error()
    return None


def grammar_of(constraint: Constraint) -> Grammar:
    """A constraint's grammar text, within the budget.

    Raises:
        RequestError: the constraint is invalid, or past `MAX_CHOICES` / `MAX_GRAMMAR_CHARS`.
    """
    from llguidance import LLMatcher

    spec, kind, param = constraint.spec, constraint.kind, constraint.param
    within_budget(constraint)
    try:
        if kind is ConstraintKind.JSON_SCHEMA:
            text = LLMatcher.grammar_from_json_schema(json.dumps(spec), defaults=_JSON_OPTIONS)
        elif kind is ConstraintKind.REGEX:
            text = LLMatcher.grammar_from_regex(str(spec))
        elif kind is ConstraintKind.CHOICE:
            choices = spec if isinstance(spec, list) else [spec]
            text = LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(str(c)) for c in choices))
        else:
            text = LLMatcher.grammar_from_lark(str(spec))
    except (ValueError, TypeError) as error:
        raise invalid(f"Invalid {param}: {plain_reason(str(error))}", param=param) from None
    if len(text) > MAX_GRAMMAR_CHARS:
        raise invalid(
            f"'{param}' makes a grammar of {len(text)} characters; this server compiles at most {MAX_GRAMMAR_CHARS}",
            param=param,
        )
    return Grammar(str(text), param)
