"""A small, bounded reader for the key/value header of a GGUF file.

`gguf.GGUFReader` parses every field, including the tokenizer's ~100,000 strings, into numpy
views: about five seconds per file. The model picker needs a dozen scalars, so this reader
skips arrays it is not asked for, and checks every length against the file size so that a
damaged file fails fast with a clear error instead of a huge allocation.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"
_MAX_KEY = 1 << 16
_MAX_STRING = 1 << 26  # 64 MiB: chat templates are KiB; anything bigger is damage

# GGUF value types: id -> (struct format, size). 8 = string, 9 = array.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_STRING = 8
_ARRAY = 9

Value = int | float | bool | str | list[int | float | bool | str] | None


class GGUFHeaderError(ValueError):
    """The header is malformed or truncated."""


def read_gguf_header(path: Path, want: Callable[[str], bool]) -> dict[str, Value]:
    """The header's key/value pairs for which `want(key)` is true (others are skipped)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        reader = _Reader(f, size)
        if reader.read(4) != MAGIC:
            raise GGUFHeaderError("not a GGUF file")
        version = reader.unpack("<I")
        if version not in (2, 3):
            raise GGUFHeaderError(f"unsupported GGUF version {version}")
        reader.unpack("<Q")  # tensor count
        n_kv = reader.unpack("<Q")
        if n_kv > size // 8:
            raise GGUFHeaderError(f"implausible key count {n_kv}")
        out: dict[str, Value] = {}
        for _ in range(n_kv):
            key = reader.string(_MAX_KEY)
            vtype = reader.unpack("<I")
            if want(key):
                out[key] = reader.value(vtype)
            else:
                reader.skip_value(vtype)
        return out


class _Reader:
    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f = f
        self._size = size

    def read(self, n: int) -> bytes:
        if n < 0 or self._f.tell() + n > self._size:
            raise GGUFHeaderError("the header is truncated")
        return self._f.read(n)

    def unpack(self, fmt: str) -> int:
        value = struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]
        return int(value)

    def string(self, limit: int = _MAX_STRING) -> str:
        n = self.unpack("<Q")
        if n > limit:
            raise GGUFHeaderError(f"a string of {n} bytes in the header")
        try:
            return self.read(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFHeaderError("a header string is not UTF-8") from exc

    def value(self, vtype: int) -> Value:
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            return struct.unpack(fmt, self.read(size))[0]
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type = self.unpack("<I")
            count = self.unpack("<Q")
            if count > self._size:
                raise GGUFHeaderError(f"an array of {count} items in the header")
            if item_type == _ARRAY:
                raise GGUFHeaderError("nested arrays are not supported")
            return [self.value(item_type) for _ in range(count)]  # type: ignore[misc]
        raise GGUFHeaderError(f"unknown value type {vtype}")

    def skip_value(self, vtype: int) -> None:
        if vtype in _SCALARS:
            self.read(_SCALARS[vtype][1])
        elif vtype == _STRING:
            n = self.unpack("<Q")
            self._seek(n)
        elif vtype == _ARRAY:
            item_type = self.unpack("<I")
            count = self.unpack("<Q")
            if item_type in _SCALARS:
                self._seek(count * _SCALARS[item_type][1])
            elif item_type == _STRING:
                for _ in range(count):
                    self._seek(self.unpack("<Q"))
            else:
                raise GGUFHeaderError(f"unsupported array item type {item_type}")
        else:
            raise GGUFHeaderError(f"unknown value type {vtype}")

    def _seek(self, n: int) -> None:
        if n < 0 or self._f.tell() + n > self._size:
            raise GGUFHeaderError("the header is truncated")
        self._f.seek(n, 1)
