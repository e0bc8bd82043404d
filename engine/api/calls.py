"""Tool calls streamed as the model writes them, as OpenAI's `tool_calls` deltas.

Once a reply's text begins a call (engine.api.stops.CallHoldback), its text is read here
character by character, by a reader of the format's syntax: JSON objects and Mistral's
`name[ARGS]{...}` (engine.api.calls_json), Qwen's XML (engine.api.calls_xml), LFM2's
Python-like calls (engine.api.calls_python). A call's first delta comes as soon as its name
is whole (its id, `type` and name, arguments ""), then its arguments as they come. The
arguments go out as the text the finished reply's call will have (`ToolCall.new`:
`json.dumps` of the parsed object, `ensure_ascii` off), and only as far as it is certain: a
string's characters as they come (an escape once whole), any other value once it has ended.
So the deltas of a call that the reply makes add up to its arguments, and nothing streamed is
ever taken back. A grammar makes the calls of forced and "auto" choices valid
(engine.llm.reply); a call cut short (max_tokens, a stop sequence) keeps what was streamed of
it, and the reply ends without it (docs/api.md).

Why not a partial-JSON parser (`partial-json-parser`): it parses the whole text again at
every piece and completes what is unfinished (a number, a string, the brackets) into a value,
without saying which parts are final, so text serialized from it may have to be taken back
("1" becomes "1e5" = 100000.0). These scans are one pass, bounded by the call's length.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

from engine.api.calls_json import JsonCall, NamedJsonCall
from engine.api.calls_python import PythonCall
from engine.api.calls_xml import XmlCall, schema_typer
from engine.api.stops import CallHoldback
from engine.core.call_formats import FORMATS, Syntax, ToolFormat
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


@dataclass
class _Streamed:
    index: int
    id: str
    name: str
    sent: list[str] = field(default_factory=list)

    @property
    def arguments(self) -> str:
        return "".join(self.sent)


class CallReader(Protocol):
    """One call's text, read as it comes (engine.api.calls_json, calls_xml, calls_python)."""

    name: str | None  # once whole
    broken: bool  # not a call as the format writes one: nothing more of it is streamed

    @property
    def done(self) -> bool: ...

    def feed(self, text: str) -> int:
        """Read `text` up to the call's end; how many characters were the call's."""

    def take(self) -> str:
        """The arguments' JSON text that is certain now and was not taken before."""


_BLANKS = " \t\r\n"


def _opening(calling: ToolFormat) -> str:
    """What the format writes between its marker and its first call (Mistral's and LFM2's
    lists open with `[`)."""
    return calling.prefix.removeprefix(calling.marker).strip()


def _begins(calling: ToolFormat, ch: str) -> bool:
    """Whether `ch` may begin one of the format's calls."""
    match calling.syntax:
        case Syntax.JSON:
            return ch == "{"
        case Syntax.XML:
            return ch == "<"
        case Syntax.NAMED_JSON:
            return ch.isascii() and (ch.isalnum() or ch in "_.-")
    return ch.isidentifier()


def _opens(calling: ToolFormat, ch: str) -> bool:
    """Whether `ch`, the first thing after the marker, is how the format goes on."""
    opening = _opening(calling)
    return ch == opening[0] if opening else _begins(calling, ch)


class _Scan(Enum):
    SEEK = "seek"  # for the next marker
    OPEN = "open"  # after a marker (or a joiner): what comes before a call
    CALL = "call"  # in a call
    AFTER = "after"  # after one: a joiner, or the end of the format's calls
    DONE = "done"


class CallStream:
    """With tools offered: the reply's text up to its first call as content (CallHoldback),
    then its calls as `CallDelta`s while the model writes them (with `parallel` off, only
    the first). `finish` squares them with the calls the finished reply made.

    `formats`: the model's own (the engine says which: ModelLoaded.tool_format); where
    several have the marker the reply wrote (Hermes and Qwen's XML `<tool_call>`, Mistral's
    two), what follows it decides (`{`, `<function=`, `[`, a name). `tools`: those offered,
    whose schemas type XML values as the finished call does (engine.api.calls_xml)."""

    def __init__(self, formats: Sequence[ToolFormat] = FORMATS, *,
                 tools: Sequence[Mapping[str, Any]] = (), parallel: bool = True) -> None:
        self.formats = tuple(formats)
        self.parallel = parallel
        self.held = CallHoldback([f.marker for f in self.formats],
                                 at_open=any(f.at_open for f in self.formats))
        self.streamed: list[_Streamed] = []
        self._typed = schema_typer(tools)
        self._candidates: tuple[ToolFormat, ...] = ()  # the formats the marker may begin
        self._format: ToolFormat | None = None  # the one the reply writes, once known
        self._scan = _Scan.SEEK
        self._seek = ""  # the text after the last call, as much as a marker needs
        self._opening = ""  # what must still come before the next call
        self._call: CallReader | None = None
        self._record: _Streamed | None = None  # the call being read, once its delta went out

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
        self._candidates = tuple(f for f in self.formats
                                 if (f.marker == marker if marker is not None else f.at_open))
        if not self._candidates:
            self._scan = _Scan.DONE
            return content, []
        if len(self._candidates) == 1:
            self._format = self._candidates[0]
        self._begin_call()
        return content, self._read(self.held.text[self.held.begun:])

    def _begin_call(self) -> None:
        self._scan = _Scan.OPEN
        self._opening = _opening(self._format) if self._format is not None else ""

    def _choose(self, ch: str) -> ToolFormat:
        """The format, from the first thing after its marker."""
        if self._format is None:
            self._format = next((f for f in self._candidates if _opens(f, ch)),
                                self._candidates[0])
            self._opening = _opening(self._format)
        return self._format

    def _reader(self, calling: ToolFormat) -> CallReader:
        match calling.syntax:
            case Syntax.JSON:
                return JsonCall()
            case Syntax.NAMED_JSON:
                return NamedJsonCall()
            case Syntax.XML:
                return XmlCall(self._typed)
        return PythonCall()

    def _read(self, text: str) -> list[CallDelta]:
        out: list[CallDelta] = []
        at = 0
        while at < len(text) and self._scan is not _Scan.DONE:
            if self._scan is _Scan.SEEK:
                marker = self._candidates[0].marker
                buffer = self._seek + text[at:]
                found = buffer.find(marker) if marker else -1
                if found < 0:
                    self._seek = buffer[max(0, len(buffer) - len(marker) + 1):]
                    break
                at += found + len(marker) - len(self._seek)
                self._seek = ""
                self._begin_call()
                continue
            if self._scan is _Scan.CALL:
                assert self._call is not None
                at += self._call.feed(text[at:])
                out += self._deltas(self._call)
                if self._call.done:
                    self._scan = _Scan.AFTER
                    self._call = self._record = None
                    if not self.parallel and self.streamed:
                        self._scan = _Scan.DONE
                continue
            ch = text[at]
            if ch in _BLANKS:
                at += 1
                continue
            calling = self._choose(ch)
            if self._scan is _Scan.OPEN and self._opening and ch == self._opening[0]:
                self._opening = self._opening[1:]
                at += 1
            elif self._scan is _Scan.OPEN and _begins(calling, ch) and (
                    not self._opening or calling.syntax is Syntax.JSON):
                self._opening = ""  # (a lone object after Mistral's marker is read as a call)
                self._call = self._reader(calling)
                self._scan = _Scan.CALL
            elif self._scan is _Scan.AFTER and calling.joiner and ch == calling.joiner.strip():
                self._scan = _Scan.OPEN
                at += 1
            elif self._scan is _Scan.AFTER and calling.at_open and self.held.marker is None:
                self._scan = _Scan.DONE  # a reply that is one JSON call has no other
            else:  # the format's calls end here (a closing tag), or this was not one
                self._scan = _Scan.SEEK
        return out

    def _deltas(self, call: CallReader) -> list[CallDelta]:
        """What `call` adds to the stream now: its first delta once its name is whole, then
        its arguments as far as they are certain."""
        if call.broken or call.name is None:
            return []
        out: list[CallDelta] = []
        if self._record is None:
            if not self.parallel and self.streamed:
                return []  # only the first call counts
            self._record = _Streamed(len(self.streamed), call_id(), call.name)
            self.streamed.append(self._record)
            out.append(CallDelta(self._record.index, id=self._record.id, name=call.name))
        more = call.take()
        if more:
            self._record.sent.append(more)
            out.append(CallDelta(self._record.index, more))
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
