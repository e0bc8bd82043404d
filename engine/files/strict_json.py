"""JSON that cannot surprise the code reading it.

`json.loads` accepts things no exporter writes and that break code further on: NaN and
Infinity, duplicate keys (the last one silently wins), lone surrogates (text that cannot be
encoded again), integers of thousands of digits (slow, then ValueError past 4300), and nesting
deep enough to raise RecursionError. `loads_strict` rejects all of them with a `FormatError`
before any of that can happen.

`iter_array_strict` reads a top-level array one item at a time, with the same checks, so a
caller can stop at a count limit without building the rest: a parsed value takes up to ~30
times the bytes of its text (`{},` is three bytes, an empty dict 64), so a 12 MB file of tiny
items took 363 MiB before a limit could say no.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any, NoReturn

from engine.files.regular import FormatError

MAX_INT_DIGITS = 30
# A float literal longer than this is not something an exporter writes (repr() needs <= 24).
MAX_FLOAT_CHARS = 64
_SPACE = re.compile(r"[ \t\n\r]*")


class NotAnArrayError(FormatError):
    """`iter_array_strict` was given JSON whose top level is not an array."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # e.g. "an object", as `describe` says it
        super().__init__(f"the file holds {kind}, not an array")



def loads_strict(data: bytes | bytearray | str, *, max_bytes: int, max_depth: int = 64) -> Any:
    """Parse JSON, raising FormatError for anything outside plain, finite, unambiguous JSON."""
    text = _decode(data, max_bytes)
    with _as_format_errors(max_depth):
        value = _DECODER.decode(text)
    _check_tree(value, max_depth)
    return value


def iter_array_strict(data: bytes | bytearray | str, *, max_bytes: int,
                      max_depth: int = 64) -> Iterator[Any]:
    """The items of a top-level JSON array, parsed and checked as `loads_strict` does, one at
    a time: what stays in memory is the decoded text and the items the caller keeps.

    NotAnArrayError (a FormatError) when the top level is not an array; an object is not
    parsed to say so."""
    text = _decode(data, max_bytes)
    at = _skip_space(text, 0)
    if not text.startswith("[", at):
        if text.startswith("{", at):
            raise NotAnArrayError("an object")
        raise NotAnArrayError(describe(loads_strict(text, max_bytes=max_bytes)))
    at = _skip_space(text, at + 1)
    if text.startswith("]", at):
        at += 1
    else:
        while True:
            with _as_format_errors(max_depth):
                item, at = _DECODER.raw_decode(text, at)
            _check_tree(item, max_depth - 1)  # the array is the first level
            yield item
            at = _skip_space(text, at)
            if text.startswith("]", at):
                at += 1
                break
            if not text.startswith(",", at):
                _fail_at(text, at, "Expecting ',' delimiter", max_depth)
            at = _skip_space(text, at + 1)
    if _skip_space(text, at) != len(text):
        _fail_at(text, at, "Extra data", max_depth)


def describe(value: Any) -> str:
    """How a JSON value is named in an error message: "an object", "null"..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


@contextlib.contextmanager
def _as_format_errors(max_depth: int) -> Iterator[None]:
    try:
        yield
    except json.JSONDecodeError as error:
        raise FormatError(
            f"the file is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from None
    except RecursionError:  # unreachable after the depth scan; kept so no traceback escapes
        raise FormatError(f"the file nests deeper than {max_depth} levels") from None


def _fail_at(text: str, at: int, message: str, max_depth: int) -> NoReturn:
    with _as_format_errors(max_depth):
        raise json.JSONDecodeError(message, text, at)
    raise AssertionError("unreachable")


def _skip_space(text: str, at: int) -> int:
    match = _SPACE.match(text, at)
    return match.end() if match else at


def dumps_strict(obj: Any) -> bytes:
    """Compact UTF-8 JSON that `loads_strict` reads back (no NaN, no lone surrogates)."""
    try:
        text = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError("cannot write the file: a text contains a lone surrogate") from None
    except ValueError as error:
        raise FormatError(f"cannot write the file: {error}") from None


def _decode(data: bytes | bytearray | str, max_bytes: int) -> str:
    """The text of `data`, after the size and encoding checks (a leading BOM is dropped)."""
    if isinstance(data, str):
        if len(data) > max_bytes or len(data.encode("utf-8", "surrogatepass")) > max_bytes:
            raise FormatError(f"the file is larger than the limit of {max_bytes} bytes")
        return data
    if len(data) > max_bytes:
        raise FormatError(
            f"the file is {len(data)} bytes, larger than the limit of {max_bytes} bytes"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise FormatError(f"the file is not valid UTF-8 (at byte {error.start})") from None


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise FormatError(f"an object has the key {_short(key)} twice")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise FormatError(f"the file contains {name}, which is not a JSON number")


def _bounded_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise FormatError(f"a number has more than {MAX_INT_DIGITS} digits")
    return int(literal)


def _finite_float(literal: str) -> float:
    if len(literal) > MAX_FLOAT_CHARS:
        raise FormatError(f"a number is written with more than {MAX_FLOAT_CHARS} characters")
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise FormatError(f"the number {literal} is too large")
    return value


def _check_tree(value: Any, max_depth: int) -> None:
    """Reject nesting deeper than `max_depth` and lone surrogates (json.loads makes them from
    escapes like "\\ud800"), in one walk of the parsed value.

    A walk in Python, not a scan of the text before parsing: a regex over a 40 MB file is one
    call that holds the interpreter lock for 0.3 s, and the window's thread waits on it.
    json.loads itself stops nesting that would exhaust the stack (RecursionError)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, str):
            _check_text(current)
            continue
        if not isinstance(current, dict | list):
            continue
        if depth > max_depth:
            raise FormatError(f"the file nests arrays and objects deeper than {max_depth} levels")
        if isinstance(current, dict):
            for key, item in current.items():
                _check_text(key)
                stack.append((item, depth + 1))
        else:
            stack.extend((item, depth + 1) for item in current)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        raise FormatError(
            f"a string contains a lone surrogate (\\u{code:04x}), which is not valid Unicode"
        ) from None


def _short(text: str, limit: int = 40) -> str:
    """A one-line quotation of `text` for an error message."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object_without_duplicates,
    parse_constant=_reject_constant,
    parse_int=_bounded_int,
    parse_float=_finite_float,
)

__all__ = [
    "MAX_INT_DIGITS",
    "NotAnArrayError",
    "describe",
    "dumps_strict",
    "iter_array_strict",
    "loads_strict",
]
