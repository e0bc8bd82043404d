"""Durability, which a SIGKILL test cannot see: a killed process leaves its writes in the
operating system's page cache, so a missing fsync shows only after a power cut. Instead,
these tests record the calls each write makes (fsync, rename, link, mkdir) and check their
order, and check the pragmas that make SQLite sync every commit."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine.config.settings import Settings, save_settings
from engine.core.records import from_tree
from engine.core.tree import Role, Tree
from engine.files.atomic import create_once, write_atomic
from engine.models.files import file_sha256
from engine.storage.checkpoints import Checkpoint, CheckpointStore, Identity
from engine.storage.formats.arbor_file import write_session
from engine.storage.keyfile import KEY_FILE, installation_key
from engine.storage.store import Store
from engine.storage.transfer import FileFormat, export_file


@dataclass(frozen=True)
class Step:
    kind: str  # "fsync", "fsync folder", "put" (a rename or link into place), "mkdir"
    inode: int
    path: str = ""
    size: int = 0
    mode: int = 0
    mtime_ns: int = 0


class Recorder:
    """Wraps the `os` calls that make a write durable and records them in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps: list[Step] = []
        real = {name: getattr(os, name) for name in ("fsync", "replace", "link", "mkdir")}

        def fsync(fd: int) -> None:
            st = os.fstat(fd)
            real["fsync"](fd)
            kind = "fsync folder" if stat.S_ISDIR(st.st_mode) else "fsync"
            self.steps.append(Step(kind, st.st_ino, size=st.st_size,
                                   mode=stat.S_IMODE(st.st_mode), mtime_ns=st.st_mtime_ns))

        def put(name: str) -> Callable[..., None]:
            def call(src: Any, dst: Any, **kwargs: Any) -> None:
                inode = os.stat(src).st_ino
                real[name](src, dst, **kwargs)
                self.steps.append(Step("put", inode, path=os.fspath(dst)))
            return call

        def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
            real["mkdir"](path, *args, **kwargs)
            self.steps.append(Step("mkdir", os.stat(path).st_ino, path=os.fspath(path)))

        def unsafe_rename(*_args: Any, **_kwargs: Any) -> None:
            raise AssertionError("os.rename does not replace atomically everywhere")

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", put("replace"))
        monkeypatch.setattr(os, "link", put("link"))
        monkeypatch.setattr(os, "mkdir", mkdir)
        monkeypatch.setattr(os, "rename", unsafe_rename)

    def folder_synced_after(self, folder: Path, index: int) -> bool:
        inode = folder.stat().st_ino
        return any(s.kind == "fsync folder" and s.inode == inode for s in self.steps[index:])

    def assert_durable(self, path: Path) -> None:
        """`path` was written to another name, synced whole (data, size, permissions), put in
        place by one rename or link, and then its folder was synced. Every folder made on
        the way was synced into its parent."""
        final = path.stat()
        puts = [i for i, s in enumerate(self.steps) if s.kind == "put" and s.path == str(path)]
        assert puts, f"{path.name} was not put in place by a rename or link"
        index = puts[-1]
        assert self.steps[index].inode == final.st_ino
        synced = [s for s in self.steps[:index] if s.kind == "fsync" and s.inode == final.st_ino]
        assert synced, f"{path.name} was renamed before it was synced"
        last = synced[-1]
        assert (last.size, last.mtime_ns) == (final.st_size, final.st_mtime_ns), \
            f"{path.name} changed after its fsync"
        assert last.mode == stat.S_IMODE(final.st_mode), \
            f"{path.name}'s permissions changed after its fsync"
        assert self.folder_synced_after(path.parent, index + 1), \
            f"{path.parent} was not synced after the rename"
        for i, made in enumerate(self.steps):
            if made.kind == "mkdir":
                assert self.folder_synced_after(Path(made.path).parent, i + 1), \
                    f"the new folder {made.path} was not synced into its parent"


def _record() -> Any:
    tree = Tree("sys")
    tree.add_child(tree.root_id, Role.USER, "durable?")
    return from_tree(tree, title="t")


def _plain(tmp_path: Path) -> Path:
    write_atomic(tmp_path / "plain", b"data")
    return tmp_path / "plain"


def _with_mode(tmp_path: Path) -> Path:
    write_atomic(tmp_path / "shared", b"data", mode=0o644)
    return tmp_path / "shared"


def _in_new_folders(tmp_path: Path) -> Path:
    path = tmp_path / "new" / "deeper" / "file"
    write_atomic(path, b"data")
    return path


def _created_once(tmp_path: Path) -> Path:
    assert create_once(tmp_path / "once", b"data")
    return tmp_path / "once"


def _key_file(tmp_path: Path) -> Path:
    installation_key(tmp_path / "config")
    return tmp_path / "config" / KEY_FILE


def _settings(tmp_path: Path) -> Path:
    save_settings(Settings(), tmp_path / "settings.json")
    return tmp_path / "settings.json"


def _session_file(tmp_path: Path) -> Path:
    write_session(tmp_path / "s.arbor", [_record()])
    return tmp_path / "s.arbor"


def _export(tmp_path: Path) -> Path:
    with Store(tmp_path / "c.db") as store:
        cid = store.import_records([_record()])[0]
        export_file(store, [cid], tmp_path / "out.md", FileFormat.MARKDOWN)
    return tmp_path / "out.md"


def _hash_cache(tmp_path: Path) -> Path:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    file_sha256(model, cache_dir=tmp_path / "cache")
    return next((tmp_path / "cache").iterdir())


def _checkpoint_tier(tmp_path: Path) -> Path:
    identity = Identity(
        model_sha256="a" * 64, llama_cpp_python="0.3.36", n_ctx=1024, n_batch=64,
        type_k="f16", type_v="f16", flash_attn="off", swa_full=False,
    )
    tier = CheckpointStore(identity, key=b"k" * 32, ram_budget=0, disk_dir=tmp_path / "tier")
    tier.add(Checkpoint(tokens=(1, 2, 3), blob=bytearray(100), bounds=(3,), node_id=1))
    tier.enforce_budget()  # over the RAM budget: to the disk tier
    (written,) = (tmp_path / "tier").rglob("*.ckpt")
    return written


WRITERS: dict[str, Callable[[Path], Path]] = {
    "write_atomic": _plain,
    "write_atomic with permissions": _with_mode,
    "write_atomic into new folders": _in_new_folders,
    "create_once": _created_once,
    "installation key": _key_file,
    "settings": _settings,
    "session file": _session_file,
    "export": _export,
    "model hash cache": _hash_cache,
    "checkpoint tier file": _checkpoint_tier,
}


@pytest.mark.parametrize("writer", WRITERS)
def test_every_file_is_synced_then_renamed_then_its_folder_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    recorder = Recorder(monkeypatch)
    written = WRITERS[writer](tmp_path)
    recorder.assert_durable(written)


def test_a_new_database_file_is_synced_into_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(monkeypatch)
    db = tmp_path / "data" / "c.db"
    Store(db).close()
    # SQLite syncs the file and its journals itself; the file's own name is ours to sync.
    made = next(i for i, s in enumerate(recorder.steps) if s.path == str(db.parent))
    assert recorder.folder_synced_after(tmp_path, made + 1)
    assert recorder.folder_synced_after(db.parent, made + 1)


@pytest.mark.parametrize("recover", [True, False])
def test_the_store_syncs_every_commit(tmp_path: Path, recover: bool) -> None:
    """WAL with synchronous=FULL: each COMMIT syncs the write-ahead log, so a change the
    user was told is saved survives a power cut. (NORMAL, enough to stay uncorrupted in WAL,
    syncs only at checkpoints and may lose the last commits; OFF may corrupt.) Foreign keys
    on, on every connection: they are off by default in SQLite."""
    Store(tmp_path / "c.db").close()
    with Store(tmp_path / "c.db", recover=recover) as store:
        pragma = {name: store._db.execute(f"PRAGMA {name}").fetchone()[0]
                  for name in ("journal_mode", "synchronous", "foreign_keys")}
    assert pragma == {"journal_mode": "wal", "synchronous": 2, "foreign_keys": 1}


def test_a_deeply_nested_hash_cache_costs_a_re_hash_not_every_load(tmp_path: Path) -> None:
    """json.loads raised RecursionError, outside the load's error handling: the engine ended
    at every load."""
    import hashlib

    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "file-hashes.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    assert file_sha256(model, cache_dir=cache) == hashlib.sha256(model.read_bytes()).hexdigest()
