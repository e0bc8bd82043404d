"""Calls written as XML, read as they come, as Qwen3-Coder and Qwen 3.5 write them after
`<tool_call>`: `<function=NAME>`, then `<parameter=P>\\nVALUE\\n</parameter>` for each
parameter, then `</function>` (engine.core.call_formats reads the finished reply so).

The arguments are given out (`take`) as the JSON text the finished call will have, and only as
far as it is certain: `{` once the function's name is whole, `"P": ` once a parameter's tag is,
a value's characters as they come once it can only be text (raw text is a string; `\\n` before
`</parameter>` is not part of it, so a line break waits for what follows), and a value that
may still read as JSON (`12`, `[1, 2]`, `true`, `"quoted"`) or as Python's True, False, None
once it has ended, typed as the finished call types it: as read, or as its text where the
tool's schema takes that parameter as text only (the choice call_formats makes for the whole
call, made here for the one parameter; where the two differ, engine.api.calls' `finish`
squares the stream with the call made).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any

from engine.api.call_reader import CallReader
from engine.api.calls_json import json_chars
from engine.core.call_formats import xml_text, xml_value
from engine.core.tools import valid_parameter

Typer = Callable[[str, str, Any], Any]  # (tool, parameter, value read) -> the value it keeps


def schema_typer(tools: Sequence[Mapping[str, Any]]) -> Typer:
    """How the finished call types a parameter's value read as JSON: as read, or its text
    where the tool's schema takes the text for that parameter and not the value."""
    def typed(name: str, key: str, value: Any) -> Any:
        if isinstance(value, str) or valid_parameter(tools, name, key, value):
            return value
        text = xml_text(value)
        return text if valid_parameter(tools, name, key, text) else value

    return typed


_BLANKS = " \t\n\r"  # what JSON reads as whitespace around a value
_BRACKETS = frozenset('{["')  # a value that opens so may be JSON until it has ended
_JSON_WORDS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_PY_WORDS = ("True", "False", "None")  # only as the whole value (call_formats.xml_value)
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_NUMBER_START = re.compile(r"-?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][-+]?[0-9]*)?)?")
_ENDS = ("\n</parameter>", "</parameter>")


def may_be_literal(raw: str) -> bool:
    """Whether a value that begins with `raw` may still read as JSON, or as True, False or
    None, once whole (call_formats.xml_value); if not, it is text whatever follows."""
    body = raw.lstrip(_BLANKS)
    if not body or body[0] in _BRACKETS:
        return True
    word = body.rstrip(_BLANKS)
    if word != body:  # blanks after a word: only blanks may follow
        return word in _JSON_WORDS or _NUMBER.fullmatch(word) is not None
    words = _JSON_WORDS + (_PY_WORDS if body == raw else ())
    return (any(w.startswith(word) for w in words)
            or _NUMBER_START.fullmatch(word) is not None)


class _Kind(Enum):
    OPEN = "open"  # may be text or JSON yet
    TEXT = "text"  # a string: given out as it comes
    LITERAL = "literal"  # may read as JSON: given out once it has ended


class _XmlValue:
    """A parameter's value, from after its tag (a line break there is not part of it) to
    `</parameter>` (and a line break before that is not either)."""

    def __init__(self) -> None:
        self.ended = False
        self._started = False
        self._raw: list[str] = []  # the value's characters, known to be its
        self._tail = ""  # what may begin the value's end
        self._kind = _Kind.OPEN
        self._given = 0  # of _raw, as text

    def feed(self, ch: str) -> None:
        if not self._started:
            self._started = True
            if ch == "\n":
                return
        self._tail += ch
        while self._tail and not any(end.startswith(self._tail) for end in _ENDS):
            self._raw.append(self._tail[0])
            self._tail = self._tail[1:]
            if self._kind is _Kind.OPEN:
                self._decide()
        self.ended = self._tail in _ENDS

    def _decide(self) -> None:
        raw = "".join(self._raw)
        if not may_be_literal(raw):
            self._kind = _Kind.TEXT
        elif raw.lstrip(_BLANKS)[:1] in _BRACKETS:
            self._kind = _Kind.LITERAL

    def take(self) -> str:
        """The value's text that is certain now: a string's, from its opening quote."""
        if self._kind is not _Kind.TEXT or self._given == len(self._raw):
            return ""
        opening = '"' if self._given == 0 else ""
        out = opening + json_chars("".join(self._raw[self._given:]))
        self._given = len(self._raw)
        return out

    def end(self, typed: Callable[[Any], Any]) -> str:
        """The rest of the value's JSON text, once it has ended; `typed`: how the finished
        call types a value read as JSON."""
        if self._kind is _Kind.TEXT:
            return self.take() + '"'
        value = xml_value("".join(self._raw))
        return json.dumps(value if isinstance(value, str) else typed(value),
                          ensure_ascii=False)


class _At(Enum):
    FUNCTION = "function"  # `<function=` in progress
    NAME = "name"
    BETWEEN = "between"  # `<parameter=` or `</function>` next
    KEY = "key"
    VALUE = "value"
    DONE = "done"


_OPEN_FUNCTION = "<function="
_OPEN_PARAMETER = "<parameter="
_CLOSE_FUNCTION = "</function>"


class XmlCall(CallReader):
    """One call, from its `<function=` to its `</function>`; `typed`: how the finished call
    types a value read as JSON (`schema_typer`)."""

    def __init__(self, typed: Typer) -> None:
        super().__init__()
        self._typed = typed
        self._at = _At.FUNCTION
        self._word = ""  # a tag, a name or a key, so far
        self._key = ""
        self._keys = 0
        self._value = _XmlValue()

    @property
    def done(self) -> bool:
        return self._at is _At.DONE

    def _pending(self) -> str:
        return self._value.take() if self._at is _At.VALUE else ""

    def _read(self, ch: str) -> None:
        match self._at:
            case _At.VALUE:
                self._value.feed(ch)
                if self._value.ended:
                    self._out.append(self._value.end(
                        lambda value: self._typed(self.name or "", self._key, value)))
                    self._at, self._word = _At.BETWEEN, ""
            case _At.FUNCTION:
                self._word += ch
                if self._word == _OPEN_FUNCTION:
                    self._at, self._word = _At.NAME, ""
                elif not _OPEN_FUNCTION.startswith(self._word):
                    self._broken()
            case _At.NAME | _At.KEY if ch == "\n":
                self._broken()
            case _At.NAME | _At.KEY if ch != ">":
                self._word += ch
            case _At.NAME:
                self.name = self._word.strip()
                if not self.name:
                    self._broken()
                    return
                self._out.append("{")
                self._at, self._word = _At.BETWEEN, ""
            case _At.KEY:
                if not self._word:  # `<parameter=>` is not a parameter
                    self._broken()
                    return
                self._key = self._word.strip()
                self._out.append(f"{', ' if self._keys else ''}"
                                 f"{json.dumps(self._key, ensure_ascii=False)}: ")
                self._keys += 1
                self._value = _XmlValue()
                self._at = _At.VALUE
            case _At.BETWEEN if not self._word and ch in _BLANKS:
                pass
            case _At.BETWEEN:
                self._word += ch
                if self._word == _OPEN_PARAMETER:
                    self._at, self._word = _At.KEY, ""
                elif self._word == _CLOSE_FUNCTION:
                    self._out.append("}")
                    self._at = _At.DONE
                elif not (_OPEN_PARAMETER.startswith(self._word)
                          or _CLOSE_FUNCTION.startswith(self._word)):
                    self._broken()

    def _broken(self) -> None:
        self.broken = True
        self._at = _At.DONE
