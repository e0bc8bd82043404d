"""The Hugging Face access token for gated and private repositories.

Kept in the OS keyring (`keyring`: macOS Keychain, Windows Credential Locker, the Secret
Service on Linux) when one is there, else in a file only the user can read (0600) in Arbor's
config folder. `HF_TOKEN` in the environment, the variable huggingface_hub reads, wins for one
run. The token is never logged and never part of a message: callers get it as a string to
send, and this module logs only where it was found.
"""

from __future__ import annotations

import contextlib
import logging
import os
from enum import StrEnum
from pathlib import Path

from engine.files.atomic import write_atomic
from engine.files.paths import data_dirs
from engine.files.regular import FormatError, read_regular

log = logging.getLogger(__name__)

SERVICE = "Arbor"
ACCOUNT = "huggingface"
TOKEN_ENV = "HF_TOKEN"
TOKEN_FILE = "hf-token"
_MAX_TOKEN = 4096


class TokenStore(StrEnum):
    KEYRING = "keyring"
    FILE = "file"
    ENVIRONMENT = "environment"


def _file(config_dir: Path | None) -> Path:
    return (config_dir or data_dirs().config) / TOKEN_FILE


def load_token(config_dir: Path | None = None) -> str | None:
    """The token to send, or None: $HF_TOKEN, then the keyring, then the file."""
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        log.info("using the Hugging Face token from $%s", TOKEN_ENV)
        return env
    import keyring  # on use: its backends load at import
    import keyring.errors

    try:
        stored = keyring.get_password(SERVICE, ACCOUNT)
    except keyring.errors.KeyringError:
        stored = None
    if stored:
        log.info("using the Hugging Face token from the keyring")
        return stored
    path = _file(config_dir)
    try:
        text = read_regular(path, _MAX_TOKEN).decode("utf-8", "replace").strip()
    except FormatError:
        return None
    if text:
        log.info("using the Hugging Face token from %s", path)
    return text or None


def save_token(token: str, config_dir: Path | None = None) -> TokenStore:
    """Keep `token` in the keyring, or in a 0600 file when there is no usable keyring."""
    token = token.strip()
    if not token or any(c.isspace() for c in token) or len(token) > _MAX_TOKEN:
        raise ValueError("a Hugging Face token is one word of printable characters")
    import keyring
    import keyring.errors

    try:
        keyring.set_password(SERVICE, ACCOUNT, token)
        _file(config_dir).unlink(missing_ok=True)  # one place only
        return TokenStore.KEYRING
    except keyring.errors.KeyringError as exc:
        log.info("no usable keyring (%s); keeping the token in a private file",
                 type(exc).__name__)
    write_atomic(_file(config_dir), token.encode("utf-8"), mode=0o600)
    return TokenStore.FILE


def forget_token(config_dir: Path | None = None) -> None:
    """Remove the token from the keyring and the file (the environment is the user's)."""
    import keyring
    import keyring.errors

    with contextlib.suppress(keyring.errors.KeyringError):
        keyring.delete_password(SERVICE, ACCOUNT)
    _file(config_dir).unlink(missing_ok=True)
