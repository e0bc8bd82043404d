"""What an unfinished download keeps in the models folder, and who may write it.

A file is written as `<name>.part` beside a small sidecar, `<name>.part.json` (the stable
hub URL, size, sha256, the server's ETag, the bytes known synced), so that whatever stops a
download (a dropped connection, Cancel, a killed process, a full disk) the next attempt asks
for the rest (`engine.models.download_transfer`) instead of starting again. Here: the part's
and the sidecar's paths, reading and writing the sidecar, the advisory lock that keeps a
second writer (the app and `arbor-engine pull`) off a part, and the parts left unfinished,
listed to offer resuming or discarded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from engine.core.errors import printable
from engine.files.atomic import write_atomic
from engine.files.regular import FormatError, read_regular
from engine.models.remote import HubError

try:
    import fcntl
except ImportError:  # Windows: no advisory lock; the app is the only writer there
    fcntl = None  # type: ignore[assignment]

PART_SUFFIX = ".part"
SIDECAR_SUFFIX = ".part.json"
SIDECAR_VERSION = 1
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class DownloadError(HubError):
    """A download stopped; the message says whether the part was kept."""


class DownloadBusyError(DownloadError):
    """Another download (this process or another) is writing the same part."""


@dataclass(frozen=True)
class RemoteFile:
    """A file to fetch: where from, where to, and what the hub says it is."""

    repo: str
    path: str  # in the repository
    url: str  # the stable resolve URL (engine.models.remote.Hub.resolve_url)
    size: int | None
    sha256: str | None  # lowercase hex; None when the hub did not say (then not checked)

    @property
    def name(self) -> str:
        """The file's name in the models folder."""
        return PurePosixPath(self.path).name


@dataclass(frozen=True)
class PartialDownload:
    """A part left by an earlier download, which `Downloader.resume` continues."""

    part: Path
    target: Path
    remote: RemoteFile
    done: int  # bytes in the part now
    etag: str | None


def part_path(target: Path) -> Path:
    return target.with_name(target.name + PART_SUFFIX)


def sidecar_path(target: Path) -> Path:
    return target.with_name(target.name + SIDECAR_SUFFIX)


@dataclass(frozen=True)
class Sidecar:
    repo: str
    path: str
    url: str
    size: int | None
    sha256: str | None
    etag: str | None
    synced: int


def read_sidecar(path: Path) -> Sidecar | None:
    """The sidecar at `path`; None when it is missing, damaged or of another version."""
    try:
        data = json.loads(read_regular(path, 64 << 10))
    except (FormatError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("version") != SIDECAR_VERSION:
        return None

    def text(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) else None

    def number(key: str) -> int | None:
        value = data.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
            else None

    url, repo, file = text("url"), text("repo"), text("path")
    sha = text("sha256")
    if url is None or repo is None or file is None or (sha and not _HEX64.match(sha)):
        return None
    return Sidecar(repo, file, url, number("size"), sha, text("etag"), number("synced") or 0)


def write_sidecar(path: Path, remote: RemoteFile, etag: str | None, synced: int) -> None:
    """Say, atomically, which file a part is of, the server's ETag and the bytes synced."""
    data = {"version": SIDECAR_VERSION, "repo": remote.repo, "path": remote.path,
            "url": remote.url, "size": remote.size, "sha256": remote.sha256,
            "etag": etag, "synced": synced}
    write_atomic(path, json.dumps(data, indent=1).encode("utf-8"))


def list_partial(models_dir: Path) -> list[PartialDownload]:
    """The downloads left unfinished in the models folder (after Cancel, a crash, a full
    disk), to offer resuming at start."""
    out: list[PartialDownload] = []
    if not models_dir.is_dir():
        return out
    for side_path in sorted(models_dir.glob(f"*{SIDECAR_SUFFIX}")):
        target = side_path.with_name(side_path.name[: -len(SIDECAR_SUFFIX)])
        side = read_sidecar(side_path)
        part = part_path(target)
        if side is None or not part.is_file():
            continue
        remote = RemoteFile(side.repo, side.path, side.url, side.size, side.sha256)
        if remote.name != target.name:
            continue
        out.append(PartialDownload(part, target, remote, part.stat().st_size, side.etag))
    return out


def discard_partial(partial: PartialDownload) -> None:
    """Delete an unfinished download the user no longer wants."""
    with locked(partial.part):
        partial.part.unlink(missing_ok=True)
        sidecar_path(partial.target).unlink(missing_ok=True)


@contextlib.contextmanager
def locked(part: Path) -> Iterator[int]:
    """The part opened for writing (created if needed), locked against a second writer."""
    fd = os.open(part, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DownloadBusyError(f"{printable(part.name)} is being downloaded by "
                                        "another download already") from None
        yield fd
    finally:
        os.close(fd)


__all__ = [
    "PART_SUFFIX",
    "SIDECAR_SUFFIX",
    "DownloadBusyError",
    "DownloadError",
    "PartialDownload",
    "RemoteFile",
    "Sidecar",
    "discard_partial",
    "list_partial",
    "locked",
    "part_path",
    "read_sidecar",
    "sidecar_path",
    "write_sidecar",
]
