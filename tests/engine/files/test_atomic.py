"""Every file Arbor writes appears complete or not at all (engine/files/atomic.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from engine.files.atomic import create_once, write_atomic


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
