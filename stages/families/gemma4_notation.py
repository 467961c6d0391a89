"""Gemma 4's object notation read as JSON, as far as it is written.

Gemma 4 writes a call's arguments as `{city:<|"|>Paris<|"|>,n:3,tags:[<|"|>a<|"|>],when:{tz:<|"|>UTC<|"|>}}`:
keys bare (any text up to the `:`, spaces included) or quoted, strings between `<|"|>` tokens with
nothing escaped inside, numbers, `true`, `false` and `null` as JSON writes them, and whitespace
allowed between the parts. `scan_notation` turns a value into canonical JSON text in `jsonscan.py`'s
layout and under its rule: the text of a longer source starts with that of a shorter one, so a call's
arguments stream as JSON while the model writes them. An unfinished string shows its text less what
could still be its closing `<|"|>`; a key shows once its `:` comes, a word once it is whole.

Leniencies, each the way a model trained on the chat template may write: `None` is `null` (what Jinja
prints for a null value), and a key or string value may be a JSON string instead. Pure; no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import attrs

from stages.families.jsonscan import Scan, scan_value
from stages.stops import partial_suffix

QUOTE = '<|"|>'
_SPACE = " \t\n\r"
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
_NUMBER_RUN = re.compile(r"[-+0-9.eE]*")
_WORD_RUN = re.compile(r"[A-Za-z]*")
# The bare words a value may be, as JSON.
_WORDS = {"true": "true", "false": "false", "null": "null", "None": "null"}
# Structure a bare key never holds: met before the key's `:`, the notation is broken.
_NOT_IN_KEY = re.compile(r"[{}\[\],]")


class _Unfinished(Exception):
    """The source ends inside the value."""


class _Broken(Exception):
    """The source stopped being the notation."""


@attrs.define
class _Reader:
    source: str
    at: int
    out: list[str] = attrs.field(factory=list)

    def value(self) -> None:
        char = self._next()
        if char == "{":
            self._open("{", "}", self._member)
        elif char == "[":
            self._open("[", "]", self.value)
        elif char == "<":
            self._string()
        elif char == '"':
            self.out.append(self._json_string())
        elif char in "-0123456789":
            self._number()
        else:
            self._word()

    def _next(self) -> str:
        """The next character after any whitespace; raises `_Unfinished` at the end."""
        while self.at < len(self.source) and self.source[self.at] in _SPACE:
            self.at += 1
        if self.at == len(self.source):
            raise _Unfinished
        return self.source[self.at]

    def _open(self, opener: str, closer: str, item: Callable[[], None]) -> None:
        """An object or a list: `item` reads one member or element."""
        self.out.append(opener)
        self.at += 1
        if self._next() != closer:
            while True:
                item()
                char = self._next()
                if char == closer:
                    break
                if char != ",":
                    raise _Broken
                self.out.append(", ")
                self.at += 1
        self.out.append(closer)
        self.at += 1

    def _member(self) -> None:
        self.out.append(json.dumps(self._key(), ensure_ascii=False) + ": ")
        self.value()

    def _key(self) -> str:
        """A key and its `:`; nothing is shown before the key is whole."""
        char = self._next()
        if char == "<" or char == '"':
            key = self._quoted() if char == "<" else json.loads(self._json_string())
            if self._next() != ":":
                raise _Broken
        else:
            colon = self.source.find(":", self.at)
            text = self.source[self.at : colon if colon >= 0 else len(self.source)]
            if _NOT_IN_KEY.search(text) or QUOTE in text:
                raise _Broken
            if colon < 0:
                raise _Unfinished
            key = text.strip()
            self.at = colon
        self.at += 1
        return key

    def _quoted(self) -> str:
        """A whole `<|"|>…<|"|>` string's text."""
        start = self._after_quote()
        end = self.source.find(QUOTE, start)
        if end < 0:
            raise _Unfinished
        self.at = end + len(QUOTE)
        return self.source[start:end]

    def _after_quote(self) -> int:
        """Where a string's text starts, past its opening `<|"|>`."""
        if not self.source.startswith(QUOTE, self.at):
            raise _Unfinished if QUOTE.startswith(self.source[self.at :]) else _Broken
        return self.at + len(QUOTE)

    def _string(self) -> None:
        start = self._after_quote()
        end = self.source.find(QUOTE, start)
        if end >= 0:
            self.out.append(json.dumps(self.source[start:end], ensure_ascii=False))
            self.at = end + len(QUOTE)
            return
        text = self.source[start:]
        # What could still grow into the closing quote is held back.
        held = partial_suffix(text, (QUOTE,))
        # json.dumps escapes character by character: the text of a prefix is a prefix of the whole's.
        self.out.append(json.dumps(text[: len(text) - held], ensure_ascii=False)[:-1])
        raise _Unfinished

    def _json_string(self) -> str:
        scan = scan_value(self.source, self.at)
        if scan.broken:
            raise _Broken
        if scan.end is None:
            raise _Unfinished
        self.at = scan.end
        return scan.text

    def _number(self) -> None:
        written = _NUMBER_RUN.match(self.source, self.at)
        assert written is not None
        self.at = written.end()
        if self.at == len(self.source):
            # As jsonscan does: shown as written, which the whole number starts with.
            self.out.append(written.group())
            raise _Unfinished
        if not _NUMBER.fullmatch(written.group()):
            raise _Broken
        self.out.append(written.group())

    def _word(self) -> None:
        written = _WORD_RUN.match(self.source, self.at)
        assert written is not None
        word = written.group()
        if written.end() == len(self.source):
            raise _Unfinished if any(known.startswith(word) for known in _WORDS) else _Broken
        if word not in _WORDS:
            raise _Broken
        self.out.append(_WORDS[word])
        self.at = written.end()


def scan_notation(source: str, start: int = 0) -> Scan:
    """The value at `source[start:]` (after any whitespace) as canonical JSON, as far as it is written:
    `end` is where it ended once whole; `broken` where the source stopped being the notation."""
    reader = _Reader(source, start)
    try:
        reader.value()
    except _Unfinished:
        return Scan("".join(reader.out))
    except (_Broken, RecursionError):
        return Scan("".join(reader.out), broken=True)
    return Scan("".join(reader.out), reader.at)


def in_string(body: str) -> bool:
    """`body` ends inside a `<|"|>` string: its text holds no escapes, so each quote opens or closes one."""
    return body.count(QUOTE) % 2 == 1
