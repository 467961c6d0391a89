"""Calls held to their grammar under `tool_choice: auto`.

A custom tool with a grammar must get input that parses even when the
model chooses to call it. Under `auto` the output is free until the
family's call opener, and a call from there on: one grammar, in which
text is any token but the opener (and EOS), and the opener is followed by
the family's forced call over all the tools (`Family.forced`), the
custom tools' inputs held to their grammars (`base.lark_arguments`).
Because the free part works on token ids, the opener must be one token
of the vocabulary; a family whose calls open otherwise, or whose output
is messages (gpt-oss), cannot be held this way, and the caller refuses.
Beside a response format, the output is the format's text or calls, and
the first token chooses which (`formatted_or_calls_grammar`).
Pure; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef

_TOKEN_REF = re.compile(r"^<\[(\d+)\]>$")


class CannotHold(ValueError):
    """The family's output cannot hold a custom tool's grammar under `auto`."""


def lazy_call_grammar(family: Family, tools: Sequence[Tool], marker: MarkerRef, *, end_ids: Sequence[int]) -> str:
    """Free tokens, then calls whose bodies follow the family's forced grammar.

    Raises:
        CannotHold: the family has no single-token call opener.
        NotCarried: a tool's grammar cannot be carried into a JSON string.
    """
    opener, opener_id, body = _held_call(family, tools, marker)
    excluded = ",".join(str(token) for token in (opener_id, *sorted(set(end_ids))))
    return (
        "%llguidance {}\n"
        "start: free (held_call free)*\n"
        f"free: free_token*\nfree_token: <[^{excluded}]>\n"
        f"held_call: {opener} held_body\n"
        f"held_body:{body}"
    )


def formatted_or_calls_grammar(
    family: Family, tools: Sequence[Tool], marker: MarkerRef, *, text: str, parallel: bool
) -> str:
    """A response format's text (`text`, a Lark expression), or calls held to their tools' grammars.

    The model chooses at its first token: the family's call opener starts
    calls, anything the format allows starts formatted text; so a format and
    tools under `tool_choice: auto` each govern the output they apply to.

    Raises:
        CannotHold: the family has no single-token call opener.
        NotCarried: a tool's grammar cannot be carried into a JSON string.
    """
    opener, _, body = _held_call(family, tools, marker)
    calls = "held_call+" if parallel else "held_call"
    return (
        "%llguidance {}\n"
        f"start: formatted | {calls}\n"
        f"formatted: {text}\n"
        f"held_call: {opener} held_body\n"
        f"held_body:{body}"
    )


def _held_call(family: Family, tools: Sequence[Tool], marker: MarkerRef) -> tuple[str, int, str]:
    """The opener as Lark, its token id, and the rules of a call's body after it (`start:` removed)."""
    if family.trigger is None or family.splitter is not None:
        raise CannotHold(f"the {family.name} family's calls do not open with one token")
    opener = marker(family.trigger)
    opener_id = _TOKEN_REF.match(opener)
    if opener_id is None:
        raise CannotHold(f"this model's call opener {family.trigger!r} is not one token")

    def without_opener(text: str) -> str:
        return "" if text == family.trigger else marker(text)

    body = family.forced(tools, without_opener)
    if not body.startswith("start:"):
        raise CannotHold(f"the {family.name} family's forced call has no single start rule")
    return opener, int(opener_id.group(1)), body.removeprefix("start:")
