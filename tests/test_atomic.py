"""Every file Arbor writes appears complete or not at all (engine/atomic.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from engine.atomic import create_once, write_atomic
from engine.formats.native import KEY_FILE, installation_key


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.json"
    write_atomic(path, b"old")

    def no_room(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_room)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_create_once_never_replaces_a_file_someone_made_first(tmp_path: Path) -> None:
    path = tmp_path / "k"
    assert create_once(path, b"first")
    assert not create_once(path, b"second")
    assert path.read_bytes() == b"first"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["k"]


def test_the_installation_key_is_made_once_and_a_damaged_one_replaced_whole(
    tmp_path: Path,
) -> None:
    key = installation_key(tmp_path)
    assert len(key) == 32 and installation_key(tmp_path) == key
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    (tmp_path / KEY_FILE).write_bytes(key[:7])  # what a crash during an in-place write left
    fresh = installation_key(tmp_path)
    assert len(fresh) == 32 and fresh != key
    assert (tmp_path / KEY_FILE).read_bytes() == fresh
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
