"""This installation's secret key. It signs every checkpoint Arbor writes (session files and
the disk tier), so that only states this installation made are ever handed to llama.cpp.

The key is made once and whole: a temp file, fsync, then an exclusive link (`create_once`),
so a crash never leaves a short key and two processes never both win. It is never replaced:
a key file that is not exactly one key is an error the user settles, because a new key would
silently orphan every checkpoint signed with the old one.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from engine.core.errors import ArborError
from engine.files.atomic import create_once
from engine.files.paths import data_dirs
from engine.files.regular import NotRegularFileError, open_regular

KEY_FILE = "session-key"
KEY_BYTES = 32


class KeyFileError(ArborError):
    """The key file exists but cannot be used, or cannot be made; the message names the file
    and what to do."""


def installation_key(config_dir: Path | None = None) -> bytes:
    """This installation's key, created on first use (mode 0600)."""
    path = (config_dir or data_dirs().config) / KEY_FILE
    key = _read_key(path)
    if key is not None:
        return key
    key = secrets.token_bytes(KEY_BYTES)
    try:
        if create_once(path, key):
            return key
    except OSError as exc:
        raise KeyFileError(
            f"cannot create the key file {path} ({exc.strerror or exc}); make its folder "
            f"writable"
        ) from exc
    made = _read_key(path)  # another process made it first: use theirs
    if made is None:
        raise KeyFileError(f"the key file {path} vanished as it was made; start Arbor again")
    return made


def _read_key(path: Path) -> bytes | None:
    """The key `path` holds; None when there is no such file. Never blocks on a FIFO."""
    try:
        with open_regular(path) as f:
            key = f.read(KEY_BYTES + 1)
    except FileNotFoundError:
        return None
    except NotRegularFileError as exc:
        raise KeyFileError(f"the key file {path} is not a regular file; move it away and "
                           f"start Arbor again") from exc
    except OSError as exc:
        raise KeyFileError(f"cannot read the key file {path} ({exc.strerror or exc})") from exc
    if len(key) != KEY_BYTES:
        held = f"more than {KEY_BYTES}" if len(key) > KEY_BYTES else str(len(key))
        raise KeyFileError(
            f"the key file {path} holds {held} bytes, not a {KEY_BYTES}-byte key; restore "
            f"the original, or move it away to make a new key (checkpoints signed with the "
            f"old key will then be discarded)"
        )
    return key


__all__ = ["KEY_BYTES", "KEY_FILE", "KeyFileError", "installation_key"]
