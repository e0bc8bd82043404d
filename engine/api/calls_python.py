"""Calls written as Python-like lists, read as they come, as LFM2 writes them between
`<|tool_call_start|>[` and `]<|tool_call_end|>`: `name(p="v", q=1)`, joined by `, `
(engine.core.call_formats reads the finished reply with Python's parser, never running it).

The arguments are given out (`take`) as the JSON text the finished call will have, and only as
far as it is certain: `{` once the name is whole (at its `(`), `"p": ` at a keyword's `=`, a
quoted string's characters as they come (an escape once whole, decoded as Python decodes it;
`"a" "b"` is one string, so a closing quote waits for what follows), and any other value (a
number, True, null, a list, a dict, a prefixed string) once it has ended, read as the finished
call reads it (`call_formats.py_value`). A triple-quoted string, which the grammars never
write, stops the call's stream there: it comes whole at the end (engine.api.calls).
"""

from __future__ import annotations

import ast
import json
import unicodedata
from enum import Enum

from engine.api.call_reader import CallReader
from engine.api.calls_json import json_chars
from engine.core.call_formats import py_value

_BLANKS = " \t\n\r"
_QUOTES = "'\""
_SIMPLE = {"\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f", "n": "\n",
           "r": "\r", "t": "\t", "v": "\v", "\n": ""}
_HEX = {"x": 2, "u": 4, "U": 8}
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_OCTAL = frozenset("01234567")


def _escape_length(seq: str) -> int:
    """How long the escape that `seq` ("\\\\" and what followed) begins is: 0 while not known
    yet, -1 if Python does not read it."""
    kind = seq[1]
    if kind in _HEX:
        if any(c not in _HEX_DIGITS for c in seq[2:]):
            return -1
        return 2 + _HEX[kind] if len(seq) >= 2 + _HEX[kind] else 0
    if kind == "N":
        if len(seq) > 2 and seq[2] != "{":
            return -1
        return seq.find("}") + 1
    if kind in _OCTAL:
        digits = len(seq) - 1 - len(seq[1:].lstrip("01234567"))
        if digits == 3 or len(seq) - 1 > digits:  # three digits, or something else after
            return 1 + digits
        return 0
    return 2


def _unescaped(escape: str) -> str | None:
    """A whole escape's text, as Python reads it (None: it does not)."""
    kind = escape[1]
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    if kind in _OCTAL:
        return chr(int(escape[1:], 8))
    if kind in _HEX:
        point = int(escape[2:], 16)
        return chr(point) if point <= 0x10FFFF else None
    if kind == "N":
        try:
            return unicodedata.lookup(escape[3:-1])
        except KeyError:
            return None
    return escape  # an escape Python does not know keeps its backslash


class _PyString:
    """A quoted string value (`'…'` or `"…"`, or several, one after another): its text as
    JSON, given out as it comes. `feed` is False for the first character after it."""

    def __init__(self, quote: str) -> None:
        self.broken = False
        self._quote = quote  # of the piece being read; "" between pieces
        self._last = quote  # of the last piece read
        self._escape = ""
        self._text: list[str] = []  # read, not given out
        self._opened = False  # its opening quote given out
        self._empty = True  # the piece being read has no characters yet
        self._adjacent = False  # right after an empty piece: `"""` opens a triple-quoted one

    def feed(self, ch: str) -> bool:
        if self.broken:
            return True
        if self._quote:
            self._piece(ch)
            return True
        if ch in _QUOTES:
            if self._adjacent and ch == self._last:
                self.broken = True
            self._quote = self._last = ch
            self._empty, self._adjacent = True, False
            return True
        self._adjacent = False
        return ch in _BLANKS

    def _piece(self, ch: str) -> None:
        if self._escape:
            self._escape += ch
            length = _escape_length(self._escape)
            if length == 0:
                return
            escape, after = self._escape[:length], self._escape[length:]
            self._escape = ""
            text = _unescaped(escape) if length > 0 else None
            if text is None:
                self.broken = True
                return
            self._text.append(text)
            if after:
                self._piece(after)
        elif ch == "\\":
            self._escape = ch
            self._empty = False
        elif ch == self._quote:
            self._adjacent = self._empty
            self._quote = ""
        elif ch in "\n\r\0":  # not inside a quoted string
            self.broken = True
        else:
            self._text.append(ch)
            self._empty = False

    def take(self) -> str:
        if not self._text:
            return ""
        out = ("" if self._opened else '"') + json_chars("".join(self._text))
        self._text.clear()
        self._opened = True
        return out

    def end(self) -> str | None:
        return self.take() + ('"' if self._opened else '""')


class _PyLiteral:
    """Any other value: its text up to a `,` or `)` outside brackets and quotes, then its
    JSON, as the finished call reads it. `feed` is False for the character after it."""

    def __init__(self) -> None:
        self.broken = False
        self._raw: list[str] = []
        self._depth = 0
        self._quote = ""
        self._escaped = False

    def feed(self, ch: str) -> bool:
        if self._quote:
            if self._escaped:
                self._escaped = False
            elif ch == "\\":
                self._escaped = True
            elif ch == self._quote:
                self._quote = ""
        elif ch in _QUOTES:
            self._quote = ch
        elif ch in "([{":
            self._depth += 1
        elif ch in ")]}" or (ch == "," and self._depth == 0):
            if self._depth == 0:
                return False
            self._depth -= 1
        self._raw.append(ch)
        return True

    def take(self) -> str:
        return ""

    def end(self) -> str | None:
        try:
            node = ast.parse("".join(self._raw).strip(), mode="eval").body
            return json.dumps(py_value(node), ensure_ascii=False)
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            return None


class _At(Enum):
    NAME = "name"
    NAME_END = "name-end"  # blanks after the name: `(` next
    ARGS = "args"  # a keyword or `)` next
    KEY = "key"
    KEY_END = "key-end"  # blanks after a keyword: `=` next
    VALUE_START = "value-start"
    VALUE = "value"
    AFTER_VALUE = "after-value"  # `,` or `)` next
    DONE = "done"


class PythonCall(CallReader):
    """One call, from its name to its `)`."""

    def __init__(self) -> None:
        super().__init__()
        self._at = _At.NAME
        self._word = ""  # the name or a keyword, so far
        self._keys = 0
        self._value: _PyString | _PyLiteral = _PyLiteral()

    @property
    def done(self) -> bool:
        return self._at is _At.DONE

    def _pending(self) -> str:
        return self._value.take() if self._at is _At.VALUE else ""

    def _read(self, ch: str) -> None:
        match self._at:
            case _At.VALUE:
                self._value_char(ch)
            case _At.NAME | _At.KEY if (self._word + ch).isidentifier():
                self._word += ch
            case _At.NAME | _At.NAME_END if ch == "(":
                self.name = self._word
                self._out.append("{")
                self._at = _At.ARGS
            case _At.NAME if ch in _BLANKS:
                self._at = _At.NAME_END
            case _At.KEY if ch in _BLANKS:
                self._at = _At.KEY_END
            case _At.KEY | _At.KEY_END if ch == "=":
                self._out.append(f"{', ' if self._keys else ''}"
                                 f"{json.dumps(self._word, ensure_ascii=False)}: ")
                self._keys += 1
                self._at = _At.VALUE_START
            case _At.NAME_END | _At.ARGS | _At.KEY_END | _At.VALUE_START | _At.AFTER_VALUE \
                    if ch in _BLANKS:
                pass
            case _At.ARGS | _At.AFTER_VALUE if ch == ")":
                self._out.append("}")
                self._at = _At.DONE
            case _At.ARGS if ch.isidentifier():
                self._word = ch
                self._at = _At.KEY
            case _At.VALUE_START:
                self._value = _PyString(ch) if ch in _QUOTES else _PyLiteral()
                if isinstance(self._value, _PyLiteral):
                    self._value.feed(ch)
                self._at = _At.VALUE
            case _At.AFTER_VALUE if ch == ",":
                self._at = _At.ARGS
            case _:
                self._broken()

    def _value_char(self, ch: str) -> None:
        value = self._value
        if value.feed(ch):
            if value.broken:
                self._broken()
            return
        text = value.end()
        if text is None:
            self._broken()
            return
        self._out.append(text)
        self._at = _At.AFTER_VALUE
        self._read(ch)

    def _broken(self) -> None:
        self.broken = True
        self._at = _At.DONE
