"""One download's transfer, from where its part ends to the verified file in place.

`Transfer` asks for the rest of the file with HTTP Range requests (httpx), through dropped
connections and the downloader's RetryPolicy; hashes the bytes as it writes them; checks free
disk space before and while writing; fsyncs the part, and says so in its sidecar, every
`SYNC_EVERY` bytes and whenever it stops; and at the end checks the size and sha256, renames
the part into place and records the sha256 in the model-hash cache (engine.models.files).
What each of these promises is told in `engine.models.download`; the part and its sidecar
are `engine.models.download_parts`'.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from engine.core.errors import printable
from engine.files.atomic import fsync_folder
from engine.models.download_parts import (
    DownloadError,
    RemoteFile,
    part_path,
    read_sidecar,
    sidecar_path,
    write_sidecar,
)
from engine.models.files import remember_sha256
from engine.models.remote import HubCancelledError, offline_error, raise_for_status

if TYPE_CHECKING:
    from engine.models.download import Downloader

log = logging.getLogger(__name__)

HASH_BLOCK = 8 << 20  # bytes per read when hashing a part that is resumed
SYNC_EVERY = 64 << 20  # fsync the part and note it in the sidecar this often
DISK_CHECK_EVERY = 16 << 20
DISK_RESERVE = 256 << 20  # never fill the disk past this much free space
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class ChecksumMismatchError(DownloadError):
    """The bytes do not hash to the hub's sha256; the part was deleted."""


class DiskFullError(DownloadError):
    """Not enough free disk space; the part was kept."""


@dataclass(frozen=True)
class Progress:
    """One step of a download, for a progress bar (the window throttles how often it
    repaints)."""

    name: str
    done: int  # bytes of the file on disk
    total: int | None
    resumed_from: int  # bytes that were already there when this download started
    bytes_per_second: float | None  # over this download so far
    seconds_left: float | None
    retries: int  # connections dropped and retried so far


@dataclass(frozen=True)
class Downloaded:
    path: Path
    size: int
    sha256: str
    resumed_from: int  # bytes already in the part before this download
    fetched: int  # bytes received over the network by this download
    retries: int


ProgressCallback = Callable[[Progress], None]


class Transfer:
    """One download's state: the part's descriptor, the running hash, the counters."""

    def __init__(self, owner: Downloader, remote: RemoteFile, target: Path, fd: int,
                 progress: ProgressCallback | None, cancel: threading.Event) -> None:
        self.owner = owner
        self.remote = remote
        self.target = target
        self.part = part_path(target)
        self.sidecar = sidecar_path(target)
        self.fd = fd
        self.progress = progress
        self.cancel = cancel
        self.hash = hashlib.sha256()
        self.offset = 0
        self.etag: str | None = None
        self.synced = 0
        self.unsynced_from: int | None = None  # where the part's unsynced bytes begin
        self.resumed_from = 0
        self.fetched = 0
        self.retries = 0
        self.started = time.monotonic()
        self.next_disk_check = 0
        self.next_sync = SYNC_EVERY

    def run(self) -> Downloaded:
        self._adopt_part()
        self._check_disk(before=True)
        while True:
            self._fetch_rest()
            done = self._finish()
            if done is not None:
                return done

    def _fetch_rest(self) -> None:
        """Fetch from the offset to the end, through dropped connections and retries."""
        fruitless = 0
        while self.remote.size is None or self.offset < self.remote.size:
            if self.cancel.is_set():
                self._keep("cancelled")
                raise HubCancelledError(f"cancelled: {self.offset} bytes of "
                                        f"{printable(self.remote.name)} kept to resume")
            before = self.offset
            try:
                if self._attempt():  # the server said the file ends here
                    break
                fruitless = 0
            except (httpx.TransportError, _Dropped) as exc:
                self._keep("dropped")
                if self.offset > before:
                    fruitless = 0
                else:
                    fruitless += 1
                if fruitless >= self.owner.retry.attempts:
                    if isinstance(exc, httpx.TransportError):
                        raise offline_error(exc, self.owner.hub.endpoint) from exc
                    raise DownloadError(f"the download of {printable(self.remote.name)} "
                                        f"keeps failing ({exc}); {self.offset} bytes kept "
                                        "to resume") from exc
                self.retries += 1
                pause = 0.0 if fruitless == 0 else min(
                    self.owner.retry.first_pause * 2 ** (fruitless - 1),
                    self.owner.retry.max_pause)
                log.info("connection lost at %d bytes of %s (%s); retry %d in %.1f s",
                         self.offset, self.remote.name, type(exc).__name__, self.retries,
                         pause)
                if pause and self.cancel.wait(pause):
                    continue  # cancelled during the pause: said at the loop's top

    def _adopt_part(self) -> None:
        """Continue the part if its sidecar describes this file; else start afresh."""
        side = read_sidecar(self.sidecar)
        size = os.fstat(self.fd).st_size
        same = side is not None and side.url == self.remote.url and (
            side.sha256 == self.remote.sha256 or self.remote.sha256 is None)
        if same and side is not None and size > 0 and (
                self.remote.size is None or size <= self.remote.size):
            self.offset = size
            self.etag = side.etag
            self.synced = min(side.synced, size)
            self.resumed_from = size
            if size > self.synced:  # written after the last fsync: kept unless it hashes wrong
                self.unsynced_from = self.synced
            self._hash_existing(size)
            log.info("resuming %s from %d bytes", self.remote.name, size)
        else:
            if size:
                log.info("the part of %s is not this file's: starting again", self.remote.name)
            os.ftruncate(self.fd, 0)
        self._write_sidecar()

    def _hash_existing(self, size: int) -> None:
        os.lseek(self.fd, 0, os.SEEK_SET)
        left = size
        while left:
            chunk = os.read(self.fd, min(HASH_BLOCK, left))
            if not chunk:
                raise DownloadError(f"the part of {printable(self.remote.name)} shrank "
                                    "while it was read")
            self.hash.update(chunk)
            left -= len(chunk)

    def _restart(self, why: str) -> None:
        log.warning("%s: downloading %s from the start", why, self.remote.name)
        self._rewind(0)
        self.resumed_from = 0

    def _rewind(self, offset: int) -> None:
        """Drop the part's bytes after `offset` and hash the ones before again."""
        os.ftruncate(self.fd, offset)
        self.hash = hashlib.sha256()
        self._hash_existing(offset)
        self.offset = self.synced = offset
        self.unsynced_from = None

    def _attempt(self) -> bool:
        """One request from the current offset; True when it reached the file's end."""
        headers = {"Range": f"bytes={self.offset}-"} if self.offset else {}
        hub = self.owner.hub
        with hub.client() as client, client.stream(
                "GET", self.remote.url, headers=headers) as response:
            if response.status_code == 416 and self.offset:
                # Nothing after the offset: the part is whole (killed before the rename),
                # or longer than the file, which the hash check then tells.
                return True
            raise_for_status(response, self.remote.repo, self.remote.path)
            etag = _etag(response)
            if response.status_code == 206:
                start, total = _content_range(response)
                if start != self.offset:
                    raise DownloadError(f"the server sent bytes from {start}, not from "
                                        f"{self.offset}")
                if self.etag and etag and etag != self.etag:
                    self._restart("the file changed on the server")
                    return False
                self._learn_size(total)
            else:
                if self.offset:
                    self._restart("the server does not resume (no range support)")
                length = response.headers.get("content-length", "")
                self._learn_size(int(length) if length.isdigit() else None)
            if etag and etag != self.etag:
                self.etag = etag
                self._write_sidecar()
            for chunk in response.iter_raw():  # as it arrives: a kill loses nothing read
                if self.cancel.is_set():
                    return False
                self._write(chunk)
            if self.remote.size is not None and self.offset < self.remote.size:
                raise _Dropped("the server closed the connection early")
            return True

    def _learn_size(self, total: int | None) -> None:
        if total is None:
            return
        if self.remote.size is None:
            self.remote = replace(self.remote, size=total)
            self._write_sidecar()
        elif total != self.remote.size:
            raise DownloadError(f"the server's {printable(self.remote.name)} has {total} "
                                f"bytes, not the {self.remote.size} the hub lists")

    def _write(self, chunk: bytes) -> None:
        if self.remote.size is not None and self.offset + len(chunk) > self.remote.size:
            raise DownloadError(f"the server sent more than the {self.remote.size} bytes of "
                                f"{printable(self.remote.name)}")
        if self.offset >= self.next_disk_check:
            self._check_disk(before=False)
            self.next_disk_check = self.offset + DISK_CHECK_EVERY
        view = memoryview(chunk)
        while view:
            try:
                n = _write_at(self.fd, view, self.offset)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    self._keep("disk full")
                    raise DiskFullError(self._disk_full_message()) from exc
                raise
            self.hash.update(view[:n])
            self.offset += n
            self.fetched += n
            view = view[n:]
        if self.offset >= self.next_sync:
            self._keep("sync")
            self.next_sync = self.offset + SYNC_EVERY
        if self.progress is not None:
            self.progress(self._progress())

    def _progress(self) -> Progress:
        elapsed = time.monotonic() - self.started
        speed = self.fetched / elapsed if elapsed > 0 and self.fetched else None
        total = self.remote.size
        left = (total - self.offset) / speed if speed and total is not None else None
        return Progress(self.remote.name, self.offset, total, self.resumed_from, speed, left,
                        self.retries)

    def _check_disk(self, *, before: bool) -> None:
        if self.remote.size is None:
            return
        need = self.remote.size - self.offset
        free = _free_bytes(self.owner.models_dir)
        short = (free - need < DISK_RESERVE) if before else (free < DISK_RESERVE)
        if short:
            self._keep("disk full")
            raise DiskFullError(self._disk_full_message(need if before else None))

    def _disk_full_message(self, need: int | None = None) -> str:
        wanted = f" ({_gib(need)} more are needed)" if need else ""
        return (f"the disk holding the models folder is full{wanted}: "
                f"{self.offset} bytes of {printable(self.remote.name)} are kept; free some "
                "space and resume")

    def _keep(self, why: str) -> None:
        """Make what is written durable and say so in the sidecar."""
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, self.offset)  # nothing past what was counted
            os.fsync(self.fd)
            self.synced = self.offset
        try:
            self._write_sidecar()
        except OSError as exc:  # a full disk may refuse even the sidecar: the part stays
            log.info("cannot update the sidecar of %s (%s): %s", self.remote.name, why, exc)

    def _write_sidecar(self) -> None:
        write_sidecar(self.sidecar, self.remote, self.etag, self.synced)

    def _finish(self) -> Downloaded | None:
        """The verified file in place; None when the part's unsynced tail must be fetched
        again; ChecksumMismatchError (the part deleted) when the bytes are wrong."""
        digest = self.hash.hexdigest()
        size = self.offset
        os.fsync(self.fd)
        bad_size = self.remote.size is not None and size != self.remote.size
        if bad_size or (self.remote.sha256 is not None and digest != self.remote.sha256):
            if self.unsynced_from is not None:
                # A machine that stopped (power, a crash) may have kept the part's size but
                # not the bytes written after the last fsync: fetch those again before
                # calling the whole file damaged.
                log.warning("%s does not verify; fetching again the bytes after %d, written "
                            "after the last sync before the download stopped",
                            self.remote.name, self.unsynced_from)
                self._rewind(self.unsynced_from)
                return None
            self.part.unlink(missing_ok=True)
            self.sidecar.unlink(missing_ok=True)
            what = (f"{size} bytes, not {self.remote.size}" if bad_size else
                    f"sha256 {digest}, not the hub's {self.remote.sha256}")
            raise ChecksumMismatchError(
                f"{printable(self.remote.name)} arrived damaged ({what}); the partial file "
                "was deleted: download it again")
        os.replace(self.part, self.target)
        fsync_folder(self.target.parent)
        self.sidecar.unlink(missing_ok=True)
        remember_sha256(self.target, digest, self.owner.cache_dir)
        log.info("downloaded %s: %d bytes (%d resumed, %d fetched, %d retries), sha256 %s",
                 self.remote.name, size, self.resumed_from, self.fetched, self.retries, digest)
        return Downloaded(self.target, size, digest, self.resumed_from, self.fetched,
                          self.retries)


class _Dropped(Exception):
    """The server ended a response before the file's end."""


def _write_at(fd: int, data: memoryview, offset: int) -> int:
    """Write at `offset`; how many bytes went. A seam for tests that inject ENOSPC."""
    if hasattr(os, "pwrite"):
        return os.pwrite(fd, data, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.write(fd, data)


def _free_bytes(folder: Path) -> int:
    """Free space for this user on the disk holding `folder` (a seam for tests)."""
    return shutil.disk_usage(folder).free


def _etag(response: httpx.Response) -> str | None:
    """The file's ETag, weak marker and quotes removed; the hub's redirect carries the
    content's (X-Linked-Etag), which a CDN's own ETag may not equal."""
    for r in (*response.history, response):
        value = r.headers.get("x-linked-etag")
        if value:
            return value.removeprefix("W/").strip('"')
    value = response.headers.get("etag")
    return value.removeprefix("W/").strip('"') if value else None


def _content_range(response: httpx.Response) -> tuple[int, int | None]:
    match = _CONTENT_RANGE.match(response.headers.get("content-range", ""))
    if not match:
        raise DownloadError("the server's answer to a range request has no valid "
                            "Content-Range")
    total = match.group(3)
    return int(match.group(1)), None if total == "*" else int(total)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


__all__ = [
    "ChecksumMismatchError",
    "DiskFullError",
    "Downloaded",
    "Progress",
    "ProgressCallback",
    "Transfer",
]
