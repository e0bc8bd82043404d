"""The installation key (engine/storage/keyfile.py): made once and whole, never replaced."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from engine.core.errors import ArborError
from engine.core.records import from_tree
from engine.core.tree import Tree
from engine.files import atomic
from engine.files.paths import data_dirs
from engine.storage.checkpoints import Checkpoint, Identity
from engine.storage.formats.arbor_file import SessionCheckpoint, read_session, write_session
from engine.storage.keyfile import KEY_FILE, KeyFileError, installation_key

IDENTITY = Identity(
    model_sha256="a" * 64, llama_cpp_python="0.3.36", n_ctx=1024, n_batch=64,
    type_k="f16", type_v="f16", flash_attn="off", swa_full=False,
)


def test_the_key_is_made_once_with_mode_0600(tmp_path: Path) -> None:
    key = installation_key(tmp_path)
    assert len(key) == 32 and installation_key(tmp_path) == key
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [KEY_FILE]


@pytest.mark.parametrize("damage", ["trailing newline", "short", "empty"])
def test_a_key_of_the_wrong_length_is_refused_and_never_replaced(
    damage: str, tmp_path: Path
) -> None:
    key = installation_key(tmp_path)
    held = {"trailing newline": key + b"\n", "short": key[:7], "empty": b""}[damage]
    (tmp_path / KEY_FILE).write_bytes(held)  # a copied key, a crash of an old in-place write
    with pytest.raises(KeyFileError) as raised:
        installation_key(tmp_path)
    message = str(raised.value)
    assert str(tmp_path / KEY_FILE) in message and "move it away" in message
    assert "\n" not in message
    assert (tmp_path / KEY_FILE).read_bytes() == held  # never overwritten
    assert [p.name for p in tmp_path.iterdir()] == [KEY_FILE]


def test_a_fifo_in_place_of_the_key_is_refused_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / KEY_FILE)
    with pytest.raises(KeyFileError, match="not a regular file"):
        installation_key(tmp_path)
    assert stat.S_ISFIFO((tmp_path / KEY_FILE).lstat().st_mode)


def test_a_failed_creation_leaves_no_key_file_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key goes to a temp file, is fsynced, then linked into place: a full disk (or a
    crash) before the link leaves nothing, never a short key that a later start refuses."""

    def no_room(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", no_room)
    with pytest.raises(KeyFileError, match="No space left") as raised:
        installation_key(tmp_path)
    assert str(tmp_path / KEY_FILE) in str(raised.value)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert len(installation_key(tmp_path)) == 32  # the next start makes it


def test_when_another_process_makes_the_key_first_theirs_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = b"t" * 32
    create_once = atomic.create_once

    def race(path: Path, data: bytes) -> bool:
        assert create_once(path, theirs)  # the other process wins the link
        return create_once(path, data)

    monkeypatch.setattr("engine.storage.keyfile.create_once", race)
    assert installation_key(tmp_path) == theirs
    assert (tmp_path / KEY_FILE).read_bytes() == theirs


def test_reading_a_session_file_with_a_damaged_key_fails_with_one_typed_message(
    tmp_path: Path,
) -> None:
    """The callers (the window's importer, the engine's export and model load, the CLI)
    catch ArborError and show its message: the key's error is one of them."""
    checkpoint = Checkpoint(tokens=(1, 2, 3), blob=bytearray(b"state" * 10), bounds=(3,))
    record = from_tree(Tree("S"), title="t")
    path = tmp_path / "s.arbor"
    write_session(path, [record], [SessionCheckpoint(0, checkpoint, IDENTITY)], key=b"k" * 32)
    key_path = data_dirs().config / KEY_FILE
    key_path.parent.mkdir(parents=True)
    key_path.write_bytes(b"x" * 33)
    with pytest.raises(ArborError, match="holds more than 32 bytes") as raised:
        read_session(path, identity=IDENTITY)
    assert isinstance(raised.value, KeyFileError)
    with pytest.raises(KeyFileError):
        write_session(tmp_path / "out.arbor", [record], [SessionCheckpoint(0, checkpoint,
                                                                          IDENTITY)])
    assert not (tmp_path / "out.arbor").exists()
    assert key_path.read_bytes() == b"x" * 33
