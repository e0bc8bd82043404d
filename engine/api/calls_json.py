"""Calls written as JSON, read as they come: `{"name": ..., "arguments": {...}}` objects
(Hermes, Mistral's list, Llama 3) and Mistral's newer `name[ARGS]{...}`.

A call's arguments are given out (`take`) as the text the finished reply's call will have
(`ToolCall.new`: `json.dumps` of the parsed object, `ensure_ascii` off), and only as far as it
is certain: a number once it has ended, a string's characters as they come (an escape once
whole, a surrogate pair with both halves). This scan is one pass, bounded by the call's
length (engine.api.calls says why not a partial-JSON parser).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum

_STRICT_OFF = json.JSONDecoder(strict=False)  # a raw control character: kept, then escaped
_SCALAR = frozenset("-+.0123456789eEtruefalsn")


def _canonical_part(raw: str) -> str:
    """A string's raw JSON content (escapes as written) as json.dumps writes it."""
    try:
        decoded = _STRICT_OFF.decode(f'"{raw}"')
    except ValueError:
        return raw  # not JSON: as it came
    return json.dumps(decoded, ensure_ascii=False)[1:-1]


def _canonical_scalar(raw: str) -> str:
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False)
    except ValueError:
        return raw


class _Value:
    """One JSON value as it is written, and its text as json.dumps writes it, given out as
    far as it is certain (`take`). `feed` stops where the value ends."""

    def __init__(self) -> None:
        self.done = False
        self._out: list[str] = []
        self._depth = 0
        self._scalar: list[str] = []
        self._raw: list[str] | None = None  # a string's content in progress, escapes as written
        self._escape = ""  # an escape in progress
        self._given = 0  # of _raw: given out
        self._safe = 0  # of _raw: may be given out (no escape or surrogate pair cut)

    def take(self) -> str:
        """The canonical text that is certain now and was not taken before."""
        self._flush()
        out = "".join(self._out)
        self._out.clear()
        return out

    def feed(self, text: str) -> int:
        """Read `text` up to the value's end; how many characters were its."""
        for at, ch in enumerate(text):
            if self.done:
                return at
            if self._raw is not None:
                self._string_char(ch)
                continue
            if self._scalar:
                if ch in _SCALAR:
                    self._scalar.append(ch)
                    continue
                self._out.append(_canonical_scalar("".join(self._scalar)))
                self._scalar.clear()
                if self._depth == 0:
                    self.done = True
                    return at
            if ch in " \t\r\n":
                continue
            if ch in "{[":
                self._out.append(ch)
                self._depth += 1
            elif ch in "}]":
                self._out.append(ch)
                self._depth -= 1
                self.done = self._depth <= 0
            elif ch == ",":
                self._out.append(", ")
            elif ch == ":":
                self._out.append(": ")
            elif ch == '"':
                self._out.append('"')
                self._raw, self._given, self._safe = [], 0, 0
            else:
                self._scalar.append(ch)
        return len(text)

    def _flush(self) -> None:
        if self._raw is not None and self._safe > self._given:
            self._out.append(_canonical_part("".join(self._raw[self._given:self._safe])))
            self._given = self._safe

    def _string_char(self, ch: str) -> None:
        raw = self._raw
        assert raw is not None
        if self._escape:
            self._escape += ch
            if (len(self._escape) == 2 and ch != "u") or len(self._escape) == 6:
                raw.append(self._escape)
                high = len(self._escape) == 6 and self._escape[2:4].lower() in (
                    "d8", "d9", "da", "db")
                self._escape = ""
                if not high:  # a pair's first half waits for the second
                    self._safe = len(raw)
        elif ch == "\\":
            self._escape = ch
        elif ch == '"':
            self._safe = len(raw)
            self._flush()
            self._raw = None
            self._out.append('"')
            self.done = self._depth == 0
        else:
            raw.append(ch)
            self._safe = len(raw)


class _Stage(Enum):
    START = "start"
    KEY = "key"
    COLON = "colon"
    VALUE = "value"
    NEXT = "next"
    DONE = "done"


_ARGUMENTS = ("arguments", "parameters")  # Llama 3 writes "parameters" (engine.core.tools)


@dataclass
class JsonCall:
    """One call's JSON object, {"name": ..., "arguments": {...}}, as it is written."""

    stage: _Stage = _Stage.START
    name: str | None = None
    arguments: list[str] = field(default_factory=list)  # canonical text not yet given out
    broken: bool = False  # not a call's JSON: nothing more of it is streamed
    _key: str = ""
    _role: str = ""  # what the value being read is: "key", "name", "arguments", "quoted", ""
    _value: _Value | None = None
    _quoted: list[str] = field(default_factory=list)
    _streamed_arguments: bool = False

    @property
    def done(self) -> bool:
        return self.stage is _Stage.DONE

    def take(self) -> str:
        """The arguments' text read since the last `take`."""
        out = "".join(self.arguments)
        self.arguments.clear()
        return out

    def feed(self, text: str) -> int:
        at = 0
        while at < len(text) and not self.done:
            if self._value is not None:
                at += self._value.feed(text[at:])
                self._route(self._value.take())
                if self._value.done:
                    self._ended()
                continue
            ch = text[at]
            if ch in " \t\r\n":
                at += 1
                continue
            match self.stage, ch:
                case _Stage.START, "{":
                    self.stage = _Stage.KEY
                case _Stage.KEY, '"':
                    self._begin("key")
                    continue  # the value reads its own quote
                case _Stage.KEY | _Stage.NEXT, "}":
                    self.stage = _Stage.DONE
                case _Stage.COLON, ":":
                    self.stage = _Stage.VALUE
                case _Stage.VALUE, _:
                    role = ""
                    if self._key == "name":
                        role = "name"
                    elif self._key in _ARGUMENTS and not self._streamed_arguments:
                        role = "quoted" if ch == '"' else "arguments"
                    self._begin(role)
                    continue
                case _Stage.NEXT, ",":
                    self.stage = _Stage.KEY
                case _:
                    self.broken = True
                    self.stage = _Stage.DONE
            at += 1
        return at

    def _begin(self, role: str) -> None:
        self._role = role
        self._value = _Value()

    def _route(self, text: str) -> None:
        if self._role == "arguments":
            self.arguments.append(text)
        elif self._role in ("key", "name", "quoted"):
            self._quoted.append(text)

    def _ended(self) -> None:
        quoted = "".join(self._quoted)
        self._quoted.clear()
        self._value = None
        role, self._role = self._role, ""
        if role == "key":
            self._key = _loads_str(quoted) or ""
            self.stage = _Stage.COLON
            return
        if role == "name":
            self.name = _loads_str(quoted)
        elif role == "arguments":
            self._streamed_arguments = True
        elif role == "quoted":  # arguments as a JSON string of an object: whole, once read
            inner = _loads_str(quoted)
            try:
                value = json.loads(inner) if inner is not None else None
            except ValueError:
                value = None
            if isinstance(value, dict):
                self.arguments.append(json.dumps(value, ensure_ascii=False))
            self._streamed_arguments = True
        self.stage = _Stage.NEXT


def _loads_str(text: str) -> str | None:
    try:
        value = _STRICT_OFF.decode(text)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def json_chars(text: str) -> str:
    """`text` as json.dumps writes it inside a string's quotes (`ensure_ascii` off): a piece
    of a string at a time gives the same as the whole, character by character."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class _Named(Enum):
    NAME = "name"
    TAG = "tag"  # `[ARGS]` or `[CALL_ID]` in progress
    CALL_ID = "call-id"  # the model's own id (the call gets one of the API's)
    ARGS = "args"  # `[ARGS]` read: the object follows at once
    VALUE = "value"
    DONE = "done"


_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_ARGS_TAG = "[ARGS]"
_CALL_ID_TAG = "[CALL_ID]"


class NamedJsonCall:
    """One call as Mistral's newer templates write it after `[TOOL_CALLS]`: `name[ARGS]{...}`
    or `name[CALL_ID]id[ARGS]{...}` (engine.core.call_formats reads them so: the object right
    after `[ARGS]`). Its name is whole at the `[` after it."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.broken = False
        self._at = _Named.NAME
        self._word = ""  # the name, or a tag, so far
        self._id_read = False
        self._value: _Value | None = None
        self._out: list[str] = []

    @property
    def done(self) -> bool:
        return self._at is _Named.DONE

    def take(self) -> str:
        out = "".join(self._out)
        self._out.clear()
        return out

    def feed(self, text: str) -> int:
        at = 0
        while at < len(text) and not self.done:
            if self._value is not None:
                at += self._value.feed(text[at:])
                self._out.append(self._value.take())
                if self._value.done:
                    self._at = _Named.DONE
                continue
            self._read(text[at])
            at += 1
        return at

    def _read(self, ch: str) -> None:
        match self._at:
            case _Named.NAME if ch in _NAME_CHARS:
                self._word += ch
            case _Named.NAME | _Named.CALL_ID if ch == "[" and self._word:
                if self._at is _Named.NAME:
                    self.name = self._word
                self._at, self._word = _Named.TAG, ch
            case _Named.TAG:
                self._word += ch
                if self._word == _ARGS_TAG:
                    self._at = _Named.ARGS
                elif self._word == _CALL_ID_TAG and not self._id_read:
                    self._at, self._id_read = _Named.CALL_ID, True
                elif not _ARGS_TAG.startswith(self._word) and (
                        self._id_read or not _CALL_ID_TAG.startswith(self._word)):
                    self._broken()
            case _Named.CALL_ID if ch.isascii() and ch.isalnum():
                pass
            case _Named.ARGS if ch == "{":
                self._value = _Value()
                self._value.feed(ch)
                self._out.append(self._value.take())
                self._at = _Named.VALUE
            case _:
                self._broken()

    def _broken(self) -> None:
        self.broken = True
        self._at = _Named.DONE
