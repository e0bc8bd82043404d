"""A GGUF header read over HTTP range requests, before a byte of weights is downloaded.

`RangedFile` is a read-only, seekable file object over a URL: each read that misses its
buffer asks for one byte range, growing from 256 KiB to 8 MiB as the reader walks on (a header
is a few MiB, most of it the vocabulary, which the reader skips block by block). The header
itself is parsed by `engine.models.gguf_header`, the same bounded reader that reads local
files, so a hostile remote header costs what a local one does: at most MAX_METADATA_BYTES are
ever requested.
"""

from __future__ import annotations

import io
import logging
import os
import re
import threading
from dataclasses import dataclass
from typing import BinaryIO, cast

import httpx

from engine.core.errors import printable
from engine.models.files import HeaderSummary, summarize_header, wanted_header_key
from engine.models.gguf_header import (
    MAX_METADATA_BYTES,
    GGUFHeaderError,
    Value,
    read_gguf_header_from,
)
from engine.models.remote import (
    Hub,
    HubCancelledError,
    HubError,
    offline_error,
    raise_for_status,
)

log = logging.getLogger(__name__)

FIRST_RANGE = 256 << 10
LARGEST_RANGE = 8 << 20
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


@dataclass(frozen=True)
class RemoteHeader:
    """A remote GGUF file's header: the picker's summary and the raw fields (for fit)."""

    repo: str
    path: str
    size: int  # bytes of this file (a split model's first part)
    summary: HeaderSummary
    fields: dict[str, Value]
    bytes_read: int  # what the ranges fetched: the cost of knowing this


class RangedFile(io.RawIOBase):
    """A remote file read through HTTP range requests (see the module's docstring)."""

    def __init__(self, client: httpx.Client, url: str, repo: str, path: str,
                 cancel: threading.Event | None = None) -> None:
        super().__init__()
        self._client = client
        self._url = url
        self._repo = repo
        self._path = path
        self._cancel = cancel
        self._pos = 0
        self._buf = b""
        self._buf_at = 0
        self._next_range = FIRST_RANGE
        self.bytes_read = 0
        self.size = 0
        self._fetch(0, FIRST_RANGE)  # also learns the size from Content-Range

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self.size - self._pos
        end = min(self._pos + size, self.size)
        out = bytearray()
        while self._pos < end:
            inside = self._pos - self._buf_at
            if not 0 <= inside < len(self._buf):
                want = max(end - self._pos, self._next_range)
                self._next_range = min(self._next_range * 2, LARGEST_RANGE)
                self._fetch(self._pos, want)
                inside = 0
            piece = self._buf[inside: inside + end - self._pos]
            out += piece
            self._pos += len(piece)
        return bytes(out)

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _fetch(self, start: int, length: int) -> None:
        """Fill the buffer with bytes [start, start + length), within the bound."""
        if self._cancel is not None and self._cancel.is_set():
            raise HubCancelledError("cancelled")
        limit = min(self.size, MAX_METADATA_BYTES) if self.size else MAX_METADATA_BYTES
        stop = min(start + length, limit)
        if stop <= start:
            raise GGUFHeaderError(f"the header is larger than {MAX_METADATA_BYTES >> 20} MiB")
        try:
            with self._client.stream(
                "GET", self._url, headers={"Range": f"bytes={start}-{stop - 1}"}
            ) as response:
                raise_for_status(response, self._repo, self._path)
                if response.status_code == 206:
                    first, total = _content_range(response)
                    if first != start:
                        raise HubError(f"the server sent bytes from {first}, not {start}")
                    self.size = total
                elif start == 0:  # the whole file, ranges ignored: take what is needed
                    length_header = response.headers.get("content-length", "")
                    self.size = int(length_header) if length_header.isdigit() else 0
                else:
                    raise HubError("the server does not answer range requests")
                data = bytearray()
                for chunk in response.iter_raw():
                    data += chunk
                    if len(data) >= stop - start:
                        break
        except httpx.TransportError as exc:
            raise offline_error(exc, self._url.split("/", 3)[2]) from exc
        self._buf = bytes(data[: stop - start])
        self._buf_at = start
        self.bytes_read += len(self._buf)


def _content_range(response: httpx.Response) -> tuple[int, int]:
    match = _CONTENT_RANGE.match(response.headers.get("content-range", ""))
    if not match:
        raise HubError("the server's answer to a range request has no valid Content-Range")
    return int(match.group(1)), int(match.group(3))


def read_remote_header(hub: Hub, repo: str, path: str, revision: str = "main",
                       cancel: threading.Event | None = None) -> RemoteHeader:
    """The header of `path` in `repo`, read with range requests only. HubError on the way
    there; HubError naming the file when what comes back is not a sound GGUF header."""
    url = hub.resolve_url(repo, path, revision)
    with hub.client() as client:
        remote = RangedFile(client, url, repo, path, cancel)
        try:
            fields = read_gguf_header_from(cast(BinaryIO, remote), remote.size,
                                           wanted_header_key)
        except GGUFHeaderError as exc:
            raise HubError(f"{printable(path)} in {printable(repo)} is not a sound GGUF "
                           f"file ({exc})") from exc
    log.info("read the header of %s/%s: %d bytes in ranges", repo, path, remote.bytes_read)
    return RemoteHeader(repo=repo, path=path, size=remote.size,
                        summary=summarize_header(fields, path.rsplit("/", 1)[-1]),
                        fields=fields, bytes_read=remote.bytes_read)
