"""A JSON value read as it is written: its canonical text so far, so a
call's arguments can stream while the model writes them.

Canonical: no whitespace between tokens, `", "` and `": "` between items
and after keys (as `json.dumps` lays them out), strings and numbers as
written, except that a raw control character in a string is escaped and
an escape is held until it is whole. The canonical text of a longer
prefix always starts with that of a shorter one, so the pieces streamed
join to the whole value's text. Pure; no I/O.
"""

from __future__ import annotations

import re

import attrs

_SPACE = " \t\n\r"
_CONTROL = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
_NUMBER_CHARS = frozenset("+-0123456789.eE")
_LITERALS = ("true", "false", "null")
# A run of a string that is written as it stands, whole escapes included: most of a long argument, matched in one
# step rather than a character at a time (a streamed call's arguments are scanned again as each piece arrives).
_PLAIN_RUN = re.compile(r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})+')


@attrs.frozen
class Scan:
    """`text`: the canonical text so far; `end`: where the value ended in the source, once whole;
    `broken`: the source stopped being JSON (the text is what was valid before)."""

    text: str
    end: int | None = None
    broken: bool = False


class _Broken(Exception):
    pass


@attrs.define
class _Scanner:
    source: str
    at: int
    out: list[str] = attrs.field(factory=list)
    stack: list[str] = attrs.field(factory=list)

    def run(self) -> int | None:
        """Where the value ends, or None while it is unfinished."""
        state = "value"
        while True:
            if state != "string" and not self._skip_space():
                return None
            char = self.source[self.at]
            if state in ("value", "value_or_close", "key", "key_or_close") and char in "}]":
                if state not in ("value_or_close", "key_or_close") or "{[".index(self.stack[-1]) != "}]".index(char):
                    raise _Broken
                state = self._close(char)
            elif state in ("key", "key_or_close"):
                if char != '"':
                    raise _Broken
                if not self._string():
                    return None
                state = "colon"
            elif state == "colon":
                state = self._punct(char, ":", ": ", "value")
            elif state == "after":
                if char == ",":
                    state = self._punct(char, ",", ", ", "key" if self.stack[-1] == "{" else "value")
                elif char in "}]" and self.stack and "{[".index(self.stack[-1]) == "}]".index(char):
                    state = self._close(char)
                else:
                    raise _Broken
            elif char in "{[":
                self.stack.append(char)
                self.out.append(char)
                self.at += 1
                state = "key_or_close" if char == "{" else "value_or_close"
            else:
                if not self._scalar(char):
                    return None
                state = "after"
            if state == "after" and not self.stack:
                return self.at

    def _close(self, char: str) -> str:
        self.stack.pop()
        self.out.append(char)
        self.at += 1
        return "after"

    def _punct(self, char: str, expected: str, written: str, state: str) -> str:
        if char != expected:
            raise _Broken
        self.out.append(written)
        self.at += 1
        return state

    def _skip_space(self) -> bool:
        while self.at < len(self.source) and self.source[self.at] in _SPACE:
            self.at += 1
        return self.at < len(self.source)

    def _scalar(self, char: str) -> bool:
        if char == '"':
            return self._string()
        if char in "-0123456789":
            return self._number()
        word = next((word for word in _LITERALS if word[0] == char), None)
        if word is None:
            raise _Broken
        written = self.source[self.at : self.at + len(word)]
        if not word.startswith(written):
            raise _Broken
        self.out.append(written)
        self.at += len(written)
        return len(written) == len(word)

    def _number(self) -> bool:
        start = self.at
        while self.at < len(self.source) and self.source[self.at] in _NUMBER_CHARS:
            self.at += 1
        written = self.source[start : self.at]
        if self.at == len(self.source):
            self.out.append(written)
            return False
        if not _NUMBER.fullmatch(written):
            raise _Broken
        self.out.append(written)
        return True

    def _string(self) -> bool:
        source = self.source
        index = self.at + 1
        self.out.append('"')
        while index < len(source):
            plain = _PLAIN_RUN.match(source, index)
            if plain is not None:
                self.out.append(plain.group())
                index = plain.end()
                continue
            char = source[index]
            if char == '"':
                self.out.append(char)
                self.at = index + 1
                return True
            if char == "\\":
                # Not a whole escape (the plain run takes those): one the source stops inside, or not JSON.
                if not _escape_cut_off(source, index):
                    raise _Broken
                break
            # What else stops the plain run: a raw control character, escaped as json.dumps writes it.
            self.out.append(_CONTROL.get(char, f"\\u{ord(char):04x}"))
            index += 1
        self.at = len(source)
        return False


def _escape_cut_off(source: str, index: int) -> bool:
    """Whether the escape at `index`, which is not a whole one, is the start of one that the source stops inside."""
    kind = source[index + 1 : index + 2]
    digits = source[index + 2 : index + 6]
    return not kind or (kind == "u" and len(digits) < 4 and all(char in "0123456789abcdefABCDEF" for char in digits))


def scan_value(source: str, start: int = 0) -> Scan:
    """The JSON value that starts at `source[start:]` (after any whitespace), as far as it is written."""
    scanner = _Scanner(source, start)
    try:
        end = scanner.run()
    except _Broken:
        return Scan("".join(scanner.out), broken=True)
    return Scan("".join(scanner.out), end)
