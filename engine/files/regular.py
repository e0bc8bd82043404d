"""Reading a file Arbor did not write: only a regular file, never more than a limit."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from engine.core.errors import ArborError


class FormatError(ArborError):
    """A file was rejected; the message names the problem in one line."""


_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # 0 on Windows, which has no FIFOs to open


class NotRegularFileError(OSError):
    """A FIFO, a device, a folder...: something Arbor never reads as a file."""


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading, if it is a regular file; NotRegularFileError otherwise.

    Opened with O_NONBLOCK, so a FIFO cannot block the open, and checked with fstat on the
    open descriptor, so nothing can swap the file between the check and the read."""
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", str(path))
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; FormatError naming the problem.

    Reads at most `limit` + 1 bytes, whatever the file's size says; the size only sizes the
    first read, so memory follows the bytes actually there."""
    try:
        with open_regular(path) as f:
            chunks = [f.read(min(os.fstat(f.fileno()).st_size, limit) + 1)]
            total = len(chunks[0])
            while total <= limit and (chunk := f.read(min(1 << 20, limit + 1 - total))):
                chunks.append(chunk)  # the file grew, or its size was not its length
                total += len(chunk)
    except OSError as exc:
        raise FormatError(f"cannot read {path.name}: {exc.strerror or exc}") from exc
    if total > limit:
        raise FormatError(f"{path.name} is larger than the limit of {limit} bytes")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
