"""A small, bounded reader for the key/value header of a GGUF file.

`gguf.GGUFReader` parses every field, including the tokenizer's ~100,000 strings, into numpy
views: about five seconds per file. The model picker needs a dozen scalars, so this reader
skips arrays it is not asked for, and checks every length against the file size so that a
damaged file fails fast with a clear error instead of a huge allocation.

The picker reads every file in the models folder, so the work is bounded by what is read, not
by what the header claims: the key/values may not extend past MAX_METADATA_BYTES (real ones
take a few MiB, most of it the vocabulary), there are at most MAX_KEYS of them, an array's
count must fit in the bytes left before any item is read, arrays of fixed-size items are
skipped with one seek, and the strings of a skipped array are walked in blocks. What is kept
is bounded too: strings of at most MAX_KEPT_STRING bytes, arrays of at most MAX_ARRAY_ITEMS
items and MAX_KEPT_ITEMS array items in all; longer values are skipped even when wanted (Arbor
wants scalars, the chat template and short per-layer arrays). So a hostile header costs at
most 64 MiB of reading (about 3 s for 8 million empty strings, the worst case) and its kept
values at most what was read plus ~5 MiB. Only regular files are opened.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from engine.files.regular import open_regular

MAGIC = b"GGUF"
MAX_METADATA_BYTES = 64 << 20
MAX_KEYS = 1 << 16
MAX_ARRAY_ITEMS = 1 << 12
MAX_KEPT_ITEMS = 1 << 16
MAX_KEPT_STRING = 1 << 20
_MAX_KEY = 1 << 16
_BLOCK = 1 << 20  # strings of a skipped array are walked in blocks this size

# GGUF value types: id -> (struct format, size). 8 = string, 9 = array.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_STRING = 8
_ARRAY = 9
_U64 = struct.Struct("<Q")

Value = int | float | bool | str | list[int | float | bool | str]


class GGUFHeaderError(ValueError):
    """The header is malformed or truncated."""


class NotGGUFError(GGUFHeaderError):
    """The file does not start with the GGUF magic."""


def read_gguf_header(path: Path, want: Callable[[str], bool]) -> dict[str, Value]:
    """The header's key/value pairs for which `want(key)` is true (others are skipped, and so
    are values too long to keep). OSError if the file is not a readable regular
    file, GGUFHeaderError if its header is not a sound GGUF header."""
    with open_regular(path) as f:
        return read_gguf_header_from(f, os.fstat(f.fileno()).st_size, want)


def read_gguf_header_from(
    f: BinaryIO, size: int, want: Callable[[str], bool]
) -> dict[str, Value]:
    """`read_gguf_header` over an open file object of `size` bytes, positioned at 0: a local
    file, or a file read over HTTP range requests (engine.models.remote_header), with the
    same bounds."""
    reader = _Reader(f, size)
    if reader.read(4) != MAGIC:
        raise NotGGUFError("not a GGUF file")
    version = reader.unpack("<I")
    if version not in (2, 3):
        raise GGUFHeaderError(f"unsupported GGUF version {version}")
    reader.unpack("<Q")  # tensor count
    n_kv = reader.unpack("<Q")
    if n_kv > MAX_KEYS:
        raise GGUFHeaderError(f"implausible key count {n_kv}")
    out: dict[str, Value] = {}
    for _ in range(n_kv):
        key = reader.string(_MAX_KEY)
        value = reader.value(reader.unpack("<I"), keep=want(key))
        if value is not None:
            out[key] = value
    return out


class _Reader:
    """Reads within the file and within the first MAX_METADATA_BYTES of it."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f = f
        self._size = size
        self._end = min(size, MAX_METADATA_BYTES)
        self._items_left = MAX_KEPT_ITEMS

    def read(self, n: int) -> bytes:
        self._claim(n)
        return self._f.read(n)

    def unpack(self, fmt: str) -> int:
        value = struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]
        return int(value)

    def string(self, limit: int) -> str:
        n = self.unpack("<Q")
        if n > limit:
            raise GGUFHeaderError(f"a string of {n} bytes in the header")
        return self._text(n)

    def _text(self, n: int) -> str:
        try:
            return self.read(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFHeaderError("a header string is not UTF-8") from exc

    def value(self, vtype: int, *, keep: bool) -> Value | None:
        """The next value, or None when it was skipped: not kept, or too long to keep."""
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            data = self.read(size)
            return struct.unpack(fmt, data)[0] if keep else None
        if vtype == _STRING:
            n = self.unpack("<Q")
            if keep and n <= MAX_KEPT_STRING:
                return self._text(n)
            self._skip(n)
            return None
        if vtype != _ARRAY:
            raise GGUFHeaderError(f"unknown value type {vtype}")
        item_type = self.unpack("<I")
        if item_type in _SCALARS:
            fmt, size = _SCALARS[item_type]
            count = self._count(size)
            if not self._keeps(keep, count):
                self._skip(count * size)
                return None
            return list(struct.unpack(f"<{count}{fmt[1]}", self.read(count * size)))
        if item_type == _STRING:
            count = self._count(_U64.size)
            if not self._keeps(keep, count):
                self._skip_strings(count)
                return None
            return [self.string(MAX_KEPT_STRING) for _ in range(count)]
        raise GGUFHeaderError(f"unsupported array item type {item_type}")

    def _keeps(self, keep: bool, count: int) -> bool:
        """Whether an array of `count` items is kept; if so, it is counted."""
        if not keep or count > min(MAX_ARRAY_ITEMS, self._items_left):
            return False
        self._items_left -= count
        return True

    def _count(self, item_size: int) -> int:
        """An array's item count, checked against the bytes left before any item is read."""
        count = self.unpack("<Q")
        if count * item_size > self._end - self._f.tell():
            raise GGUFHeaderError(f"an array of {count} items does not fit in the header")
        return count

    def _skip_strings(self, count: int) -> None:
        """Skip `count` length-prefixed strings, walking blocks instead of reading each one."""
        block, at = b"", 0
        for _ in range(count):
            if at + _U64.size > len(block):
                block = block[at:] + self.read(min(_BLOCK, self._end - self._f.tell()))
                at = 0
                if len(block) < _U64.size:
                    self._claim(_U64.size)  # raises: the header ends inside the array
            at += _U64.size + _U64.unpack_from(block, at)[0]
            if at > len(block):  # this string runs past the block: skip the rest of it
                self._skip(at - len(block))
                block, at = b"", 0
        self._f.seek(at - len(block), os.SEEK_CUR)  # back to the end of the last string

    def _skip(self, n: int) -> None:
        self._claim(n)
        self._f.seek(n, os.SEEK_CUR)

    def _claim(self, n: int) -> None:
        """Check that `n` more bytes lie within the file and within the budget."""
        end = self._f.tell() + n
        if end > self._size:
            raise GGUFHeaderError("the header is truncated")
        if end > MAX_METADATA_BYTES:
            raise GGUFHeaderError(f"the header is larger than {MAX_METADATA_BYTES >> 20} MiB")
