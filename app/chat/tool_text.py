"""Tool calls and results as the chat shows them: their text, never interpreted.

A tool's result is data, not prose: the view shows it verbatim, except that a JSON object or
array is laid out for reading (`result_text`). That layout only moves whitespace between the
JSON's tokens: every string, number and key stays as written, duplicate keys and all, and
the stored text never changes. A container whose one-line form is short stays on one line;
a longer one puts each member on a line of its own, indented two spaces. A call's arguments
(JSON text, as the model wrote them) are laid out the same way.

Screen readers get a call in words (`spoken_call`): its name, and an object's arguments as
"key: value" pairs rather than punctuation.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

from engine.core.tools import ToolCall

WIDTH = 60  # a container whose one-line form is longer is broken into lines
MAX_PRETTY_CHARS = 200_000  # a longer result is shown as it came (laying it out costs time)

_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+)')


@dataclass(frozen=True)
class _Value:
    """A parsed JSON value: a scalar's token as written, or a container's members."""

    opener: str  # "{", "[", or "" for a scalar
    token: str = ""  # a scalar's text
    members: tuple[tuple[str, _Value], ...] = ()  # (key or "", value), in order
    inline: str | None = None  # the one-line form, None when longer than WIDTH


def _tokens(text: str) -> list[str]:
    found: list[str] = []
    position = 0
    end = len(text.rstrip())
    while position < end:
        match = _TOKEN.match(text, position)
        if match is None:  # json.loads accepted it, so this does not happen
            raise ValueError(f"no JSON token at {position}")
        found.append(match.group(1))
        position = match.end()
    return found


def _one_line(opener: str, members: list[tuple[str, _Value]]) -> str | None:
    closer = "}" if opener == "{" else "]"
    parts: list[str] = []
    size = 2
    for key, value in members:
        if value.inline is None:
            return None
        part = f"{key}: {value.inline}" if key else value.inline
        size += len(part) + 2
        if size > WIDTH + 2:
            return None
        parts.append(part)
    return opener + ", ".join(parts) + closer


def _parse(tokens: list[str], at: int) -> tuple[_Value, int]:
    token = tokens[at]
    if token not in ("{", "["):
        return _Value("", token=token, inline=token if len(token) <= WIDTH else None), at + 1
    closer = "}" if token == "{" else "]"
    members: list[tuple[str, _Value]] = []
    at += 1
    if tokens[at] == closer:
        return _Value(token, inline=token + closer), at + 1
    while True:
        key = ""
        if token == "{":
            key, at = tokens[at], at + 2  # the key and its ":"
        value, at = _parse(tokens, at)
        members.append((key, value))
        at += 1  # "," or the closer
        if tokens[at - 1] == closer:
            return _Value(token, members=tuple(members), inline=_one_line(token, members)), at


def _lines(value: _Value, indent: str, prefix: str, suffix: str, out: list[str]) -> None:
    """`value` as lines into `out`: the first after `prefix`, the last before `suffix`."""
    room = WIDTH - len(indent) - len(prefix) - len(suffix)
    if value.inline is not None and (len(value.inline) <= max(room, 0) or not value.members):
        out.append(f"{indent}{prefix}{value.inline}{suffix}")
        return
    if not value.members:  # a long scalar: a line of its own, wrapped by the view
        out.append(f"{indent}{prefix}{value.token}{suffix}")
        return
    out.append(f"{indent}{prefix}{value.opener}")
    inner = indent + "  "
    last = len(value.members) - 1
    for number, (key, member) in enumerate(value.members):
        _lines(member, inner, f"{key}: " if key else "", "," if number < last else "", out)
    out.append(f"{indent}{'}' if value.opener == '{' else ']'}{suffix}")


def pretty_json(text: str) -> str | None:
    """`text` laid out for reading when it is a JSON object or array (only the whitespace
    between its tokens changes); None when it is not, or is too long to lay out."""
    start = text.lstrip()[:1]
    if start not in ("{", "[") or len(text) > MAX_PRETTY_CHARS:
        return None
    try:
        json.loads(text)
        value, _end = _parse(_tokens(text), 0)
        out: list[str] = []
        _lines(value, "", "", "", out)
    except (ValueError, IndexError, RecursionError):
        return None
    return "\n".join(out)


@functools.lru_cache(maxsize=64)
def result_text(text: str) -> str:
    """A tool's result as the view shows it: JSON laid out for reading, anything else as it
    came (line breaks, indentation and all)."""
    pretty = pretty_json(text)
    return text if pretty is None else pretty


def line_count(text: str) -> int:
    """How many lines `text` shows (0 when it is empty)."""
    return text.count("\n") + 1 if text else 0


def lines_label(count: int) -> str:
    return "1 line" if count == 1 else f"{count:,} lines"


@functools.lru_cache(maxsize=64)
def arguments_text(arguments: str) -> str:
    """A call's arguments as its block shows them: laid out as a result is; none: "{}"."""
    return result_text(arguments) if arguments.strip() else "{}"


def spoken_call(call: ToolCall) -> str:
    """A call as a screen reader says it: "get_weather with city: Oslo, day: Friday"."""
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return f"{call.name} with {call.arguments}"
    if not isinstance(arguments, dict):
        return f"{call.name} with {call.arguments}"
    if not arguments:
        return call.name
    pairs = [f"{key}: {value if isinstance(value, str) else json.dumps(value)}"
             for key, value in arguments.items()]
    return f"{call.name} with {', '.join(pairs)}"
