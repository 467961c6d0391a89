"""llguidance's errors worded for a client: the reason in a bounded excerpt, and the error that ends a row.

The prompt side words a grammar that does not compile (`stages/prompt/constraints.py`); the reply side words
one that fails mid-generation (`stages/reply/sink.py`, from the reason the model thread kept). Both say
llguidance's reason the same way, so the wording lives here, at the root of `stages/`, below both rooms.
Pure: a string in, a string or a `RequestError` out.
"""

from __future__ import annotations

from pipeline.errors import RequestError, excerpt, invalid

# Lexer fuel: llguidance's default is 1M; bounded repeats (`a{1000000}`) spend it all.
LEXER_FUEL = 500_000

# llguidance's terse errors, said with the limit they hit.
_PLAIN_REASONS = {
    "too many expressions constructed": f"the lexer ran out of fuel (limit {LEXER_FUEL:,} expressions): "
    "the regex (or a repeat in it, like a{1000000}) is too large",
    "NoExtensionBias": "the grammar matches no text (a rule that can only refer to itself never ends)",
}


def plain_reason(message: str) -> str:
    """llguidance's reason, without a Rust panic's backtrace or anything past a short excerpt."""
    head = message.split("<backtrace>", 1)[0].replace("<non-verbose/>", "").strip()
    if head.startswith("panic"):
        return "the grammar is too large or too complex to compile"
    plain = next((f"{text} ({head})" for known, text in _PLAIN_REASONS.items() if known in head), None)
    return excerpt(plain or " ".join(head.split()) or "the grammar does not compile", 300)


def grammar_fault(reason: str, param: str) -> RequestError:
    """A row's grammar failed mid-generation (a limit llguidance met): the error that ends the row."""
    return invalid(
        f"The constraint in '{param}' hit a limit of the grammar engine while generating, so the output cannot "
        f"be held to it: {plain_reason(reason)}",
        param=param,
        code="invalid_grammar",
    )
