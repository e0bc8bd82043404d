"""Tool calls streamed as the model writes them, as OpenAI's `tool_calls` deltas.

Once a reply's text begins a call (engine.api.stops.CallHoldback), its text is read here
character by character: a call's first delta comes as soon as its name is whole (its id,
`type` and name, arguments ""), then its arguments as they come. The arguments go out as the
text the finished reply's call will have (`ToolCall.new`: `json.dumps` of the parsed object,
`ensure_ascii` off), and only as far as it is certain: a number once it has ended, a string's
characters as they come (an escape once whole, a surrogate pair with both halves). So the
deltas of a call that the reply makes add up to its arguments, and nothing streamed is ever
taken back. A grammar makes the calls of forced and "auto" choices valid (engine.llm.reply);
a call cut short (max_tokens, a stop sequence) keeps what was streamed of it, and the reply
ends without it (docs/api.md).

Why not a partial-JSON parser (`partial-json-parser`): it parses the whole text again at
every piece and completes what is unfinished (a number, a string, the brackets) into a value,
without saying which parts are final, so text serialized from it may have to be taken back
("1" becomes "1e5" = 100000.0). This scan is one pass, bounded by the call's length.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from engine.api.stops import CallHoldback
from engine.core.call_formats import FORMATS, ToolFormat
from engine.core.tools import ToolCall, call_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallDelta:
    """One streamed piece of a call: its first (id and name, arguments "") or more of its
    arguments' JSON text."""

    index: int
    arguments: str = ""
    id: str | None = None  # with `name`: the call's first delta
    name: str | None = None

    def body(self) -> dict[str, Any]:
        """As OpenAI streams it (`choices[0].delta.tool_calls[i]`)."""
        if self.id is not None:
            return {"index": self.index, "id": self.id, "type": "function",
                    "function": {"name": self.name, "arguments": ""}}
        return {"index": self.index, "function": {"arguments": self.arguments}}


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
class _Streamed:
    index: int
    id: str
    name: str
    sent: list[str] = field(default_factory=list)

    @property
    def arguments(self) -> str:
        return "".join(self.sent)


@dataclass
class _CallObject:
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
    streamed: _Streamed | None = None  # its record, once its first delta went out

    @property
    def done(self) -> bool:
        return self.stage is _Stage.DONE

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


class _Scan(Enum):
    SEEK = "seek"  # for the next marker
    OPEN = "open"  # after a marker (or a joiner): what comes before a call's object
    CALL = "call"  # in a call's object
    AFTER = "after"  # after one: a joiner, or the end of the format's calls
    DONE = "done"


class CallStream:
    """With tools offered: the reply's text up to its first call as content (CallHoldback),
    then its calls as `CallDelta`s while the model writes them (with `parallel` off, only
    the first). `finish` squares them with the calls the finished reply made."""

    def __init__(self, formats: Sequence[ToolFormat] = FORMATS, *,
                 parallel: bool = True) -> None:
        self.formats = tuple(formats)
        self.parallel = parallel
        self.held = CallHoldback([f.marker for f in self.formats])
        self.streamed: list[_Streamed] = []
        self._format: ToolFormat | None = None
        self._scan = _Scan.SEEK
        self._seek = ""  # the text after the last call, as much as a marker needs
        self._opening = ""  # what must still come before the next call's object
        self._call: _CallObject | None = None

    @property
    def shown(self) -> str:
        """What was passed on as content."""
        return self.held.shown

    def feed(self, piece: str) -> tuple[str, list[CallDelta]]:
        """A piece of the reply: (what to pass on as content, the calls' deltas)."""
        if self.held.calling:
            return "", self._read(piece)
        content = self.held.feed(piece)
        if not self.held.calling:
            return content, []
        marker = self.held.marker
        self._format = next((f for f in self.formats if f.marker == marker),
                            None) if marker is not None else \
            next((f for f in self.formats if f.at_open), None)
        if self._format is None:
            self._scan = _Scan.DONE
            return content, []
        self._begin_call()
        return content, self._read(self.held.text[self.held.begun:])

    def _begin_call(self) -> None:
        assert self._format is not None
        self._scan = _Scan.OPEN
        self._opening = self._format.prefix.removeprefix(self._format.marker).strip()

    def _read(self, text: str) -> list[CallDelta]:
        out: list[CallDelta] = []
        at = 0
        fmt = self._format
        while at < len(text) and fmt is not None and self._scan is not _Scan.DONE:
            if self._scan is _Scan.SEEK:
                buffer = self._seek + text[at:]
                found = buffer.find(fmt.marker) if fmt.marker else -1
                if found < 0:
                    self._seek = buffer[max(0, len(buffer) - len(fmt.marker) + 1):]
                    break
                at += found + len(fmt.marker) - len(self._seek)
                self._seek = ""
                self._begin_call()
                continue
            if self._scan is _Scan.CALL:
                assert self._call is not None
                at += self._call.feed(text[at:])
                out += self._deltas(self._call)
                if self._call.done:
                    self._scan = _Scan.AFTER
                    self._call = None
                    if not self.parallel and self.streamed:
                        self._scan = _Scan.DONE
                continue
            ch = text[at]
            if ch in " \t\r\n":
                at += 1
            elif self._scan is _Scan.OPEN and self._opening and ch == self._opening[0]:
                self._opening = self._opening[1:]
                at += 1
            elif self._scan is _Scan.OPEN and ch == "{":
                self._opening = ""
                self._call = _CallObject()
                self._scan = _Scan.CALL
            elif self._scan is _Scan.AFTER and fmt.joiner and ch == fmt.joiner:
                self._scan = _Scan.OPEN
                at += 1
            elif self._scan is _Scan.AFTER and fmt.at_open and self.held.marker is None:
                self._scan = _Scan.DONE  # a reply that is one JSON call has no other
            else:  # the format's calls end here (a closing tag), or this was not one
                self._scan = _Scan.SEEK
        return out

    def _deltas(self, call: _CallObject) -> list[CallDelta]:
        """What `call` adds to the stream now: its first delta once its name is whole, then
        its arguments as far as they are certain."""
        if call.broken or call.name is None:
            return []
        out: list[CallDelta] = []
        if call.streamed is None:
            if not self.parallel and self.streamed:
                return []  # only the first call counts
            call.streamed = _Streamed(len(self.streamed), call_id(), call.name)
            self.streamed.append(call.streamed)
            out.append(CallDelta(call.streamed.index, id=call.streamed.id, name=call.name))
        more = "".join(call.arguments)
        call.arguments.clear()
        if more:
            call.streamed.sent.append(more)
            out.append(CallDelta(call.streamed.index, more))
        return out

    def finish(self, calls: Sequence[ToolCall]) -> tuple[list[CallDelta], tuple[ToolCall, ...]]:
        """The reply ended having made `calls`: (the deltas still owed, the calls with the
        ids their deltas gave them). A call streamed whole needs none; one streamed in part
        gets the rest of its arguments; one never streamed comes whole. A streamed call the
        reply did not make (cut short, invalid) stays as it was streamed: nothing is taken
        back."""
        out: list[CallDelta] = []
        made: list[ToolCall] = []
        next_streamed = 0
        extra = len(self.streamed)
        for call in calls:
            match = next((s for s in self.streamed[next_streamed:] if s.name == call.name
                          and call.arguments.startswith(s.arguments)), None)
            if match is None:
                out.append(CallDelta(extra, id=call.id, name=call.name))
                out.append(CallDelta(extra, call.arguments))
                extra += 1
                made.append(call)
                continue
            next_streamed = match.index + 1
            rest = call.arguments[len(match.arguments):]
            if rest:
                out.append(CallDelta(match.index, rest))
            made.append(replace(call, id=match.id))
        unmade = len(self.streamed) - len({c.id for c in made} & {s.id for s in self.streamed})
        if unmade:
            log.info("%d streamed tool call(s) not made by the finished reply", unmade)
        return out, tuple(made)
