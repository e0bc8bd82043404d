"""Atomic file writes: a temp file in the same folder, its permissions, its data, fsync,
os.replace, fsync of the folder; a folder made on the way is synced into its parent too.

A crash or a full disk leaves either the old file or the new one, never a half-written one
(GPT4All lost chats to 0-byte files written in place; docs/architecture.md, "Files are
written atomically"). Every file Arbor writes
goes through here: settings, session files, exports, checkpoints, the model-hash cache and
the installation key.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_writer(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """Yield a binary file; on success it replaces `path`, on any error it vanishes. The
    file is created 0600 (mkstemp); `mode` sets other permissions, synced with the data."""
    make_folder(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.chmod(tmp, mode)
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def write_atomic(path: Path, data: bytes, *, mode: int | None = None) -> None:
    with atomic_writer(path, mode=mode) as f:
        f.write(data)


def create_once(path: Path, data: bytes) -> bool:
    """Create `path` holding `data` (mode 0600) unless it exists: complete or not at all,
    and never over a file another process created first. False when it already existed."""
    make_folder(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic, and fails if the name is taken
        except FileExistsError:
            return False
    finally:
        Path(tmp).unlink(missing_ok=True)
    fsync_folder(path.parent)
    return True


def make_folder(folder: Path) -> None:
    """Create `folder` and any missing parents, each synced into its parent: a file made
    durable inside a folder whose own name was lost in a power cut is lost with it."""
    if folder.is_dir():
        return
    if folder.parent != folder:
        make_folder(folder.parent)
    try:
        folder.mkdir()
    except FileExistsError:
        if not folder.is_dir():
            raise
        return  # made by someone else just now
    fsync_folder(folder.parent)


def fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable. Best effort: some systems cannot open a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
