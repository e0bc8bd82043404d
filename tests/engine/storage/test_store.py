"""The conversation store: persistence, transactions, migrations, hostile files, errors."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engine.core.errors import ArborError
from engine.core.records import ConversationRecord, from_tree
from engine.core.tree import Node, NodeStatus, Role, Tree
from engine.service.replay import replay
from engine.service.scenario import parse_scenario
from engine.storage.database import SCHEMA_VERSION, StoreOpenError, StoreWriteError
from engine.storage.database import write_error as _write_error
from engine.storage.store import PURGE_AFTER_S, Store, StoreSink


def _tree(*texts: str, system: str = "sys") -> Tree:
    tree = Tree(system)
    for i, text in enumerate(texts):
        tree.add_child(tree.active_leaf, Role.USER if i % 2 == 0 else Role.ASSISTANT, text)
    return tree


def _shape(tree: Tree) -> list[tuple[Any, ...]]:
    return sorted(
        (n.id, n.parent, n.role.value, n.text, n.tokens, n.status.value, n.last_active_child)
        for n in tree.nodes()
    )


def test_a_tree_round_trips_with_every_branch(tmp_path: Path) -> None:
    tree = _tree("q1", "r1", "q2", "r2")
    tree.node(2).tokens = (1, 2, 3)
    tree.add_sibling(tree.message(0).id, "q1 again")
    tree.switch_variant(tree.message(0).id, 0)
    with Store(tmp_path / "c.db") as store:
        cid = store.create(tree, title="Trees")
        loaded = store.load(cid)
    assert _shape(loaded) == _shape(tree)
    assert loaded.active_leaf == tree.active_leaf
    assert [n.text for n in loaded.messages()] == ["q1", "r1", "q2", "r2"]


def test_switching_branches_saves_the_pointers_and_leaves_other_rows_alone(
    tmp_path: Path,
) -> None:
    tree = _tree("q1", "r1", "q2", "r2")
    first = tree.message(0).id
    other = tree.add_sibling(first, "q1 again")
    tree.add_child(other.id, Role.ASSISTANT, "r1 again")
    with Store(tmp_path / "c.db") as store:
        cid = store.create(tree, title="Switch")
        changes_before = store._db.total_changes
        for variant in (0, 1, 0):
            tree.switch_variant(first, variant)
            store.save(cid, tree)
            loaded = store.load(cid)
            assert _shape(loaded) == _shape(tree)
            assert loaded.active_leaf == tree.active_leaf
        # Each switch rewrote one pointer (the root's) and the conversation row: no message
        # was rewritten or re-indexed.
        assert store._db.total_changes - changes_before == 3 * 2


def test_list_rename_soft_delete_undo_and_purge(tmp_path: Path) -> None:
    with Store(tmp_path / "c.db") as store:
        first = store.create(_tree("a"), title="first")
        second = store.create(_tree("b"), title="second")
        assert [c.title for c in store.list()] == ["second", "first"]
        store.save(first, store.load(first))  # touching it makes it the newest
        assert [c.id for c in store.list()] == [first, second]
        store.rename(first, "renamed")
        store.delete(second)
        assert [c.title for c in store.list()] == ["renamed"]
        assert store.purge(older_than_s=3600) == 0  # too recent to purge
        store.undelete(second)
        assert {c.id for c in store.list()} == {first, second}
        store.delete(second)
        assert store.purge(older_than_s=0) == 1
        assert [c.id for c in store.list(include_deleted=True)] == [first]
        assert store.search("b") == []


def test_full_text_search_finds_messages_and_skips_deleted(tmp_path: Path) -> None:
    with Store(tmp_path / "c.db") as store:
        oak = store.create(_tree("Tell me about oak trees", "Oaks live long."), title="Oak")
        store.create(_tree("What is a river?"), title="River")
        hits = store.search("oak")
        assert {(h.conversation_id, h.title) for h in hits} == {(oak, "Oak")}
        assert any("[Oak" in h.snippet or "[oak" in h.snippet for h in hits)
        assert store.search('"quoted" AND NEAR(') == []  # user text is never FTS syntax
        store.delete(oak)
        assert store.search("oak") == []


def test_fork_copies_the_path_to_a_new_conversation(tmp_path: Path) -> None:
    tree = _tree("q1", "r1", "q2", "r2")
    with Store(tmp_path / "c.db") as store:
        cid = store.create(tree, title="Base")
        fork = store.fork(cid, tree.message(1).id)
        forked = store.load(fork)
        assert [n.text for n in forked.messages()] == ["q1", "r1"]
        assert store.list()[0].title == "Base (fork)"
        assert len(store.load(cid)) == 5  # the source is unchanged


def test_a_streaming_reply_survives_a_crash_as_interrupted(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    store = Store(db)
    tree = _tree("q")
    cid = store.create(tree, title="t")
    sink = StoreSink(store, cid, interval_s=0.0)
    reply = tree.add_child(tree.active_leaf, Role.ASSISTANT, "", status=NodeStatus.STREAMING)
    sink.action(tree, [reply])
    reply.text = "partial answ"
    sink.streaming(reply)
    # The process dies here: no final save, no close.
    with Store(db) as reopened:
        node = reopened.load(cid).node(reply.id)
    assert (node.text, node.status) == ("partial answ", NodeStatus.INTERRUPTED)
    store.close()


def test_streaming_saves_are_throttled(tmp_path: Path) -> None:
    with Store(tmp_path / "c.db") as store:
        tree = _tree("q")
        cid = store.create(tree, title="t")
        sink = StoreSink(store, cid, interval_s=3600)
        reply = tree.add_child(tree.active_leaf, Role.ASSISTANT, "", status=NodeStatus.STREAMING)
        sink.action(tree, [reply])
        reply.text = "grown"
        sink.streaming(reply)  # within the interval: not written yet
        assert store.load(cid).node(reply.id).text == ""


def test_a_file_that_is_not_a_database_is_refused_and_kept(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    db.write_bytes(b"my precious notes, not a database" * 100)
    before = db.read_bytes()
    with pytest.raises(StoreOpenError, match="not an Arbor conversation database"):
        Store(db)
    assert db.read_bytes() == before


def test_a_database_from_a_newer_arbor_is_refused_and_kept(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    Store(db).close()
    with sqlite3.connect(db) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    before = db.read_bytes()
    with pytest.raises(StoreOpenError, match="newer Arbor"):
        Store(db)
    assert db.read_bytes() == before


def test_a_damaged_database_is_refused_and_kept(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with Store(db) as store:
        store.create(_tree("a"), title="t")
    data = bytearray(db.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # wreck the schema page
    db.write_bytes(bytes(data))
    with pytest.raises(StoreOpenError, match="left untouched"):
        Store(db)
    assert db.read_bytes() == bytes(data)


def test_migration_backs_up_the_file_first(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with sqlite3.connect(db) as raw:  # an old, version-0 database with something in it
        raw.execute("CREATE TABLE legacy (x)")
        raw.execute("INSERT INTO legacy VALUES (42)")
    with Store(db) as store:
        assert store.list() == []
    backups = list(tmp_path.glob("c.db.v0-*.bak"))
    assert len(backups) == 1
    with sqlite3.connect(backups[0]) as raw:
        assert raw.execute("SELECT x FROM legacy").fetchall() == [(42,)]


def test_a_version_2_store_takes_tool_results_after_its_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 3 widens the role check in place (tool results are nodes): what was stored
    stays, a tool node is saved and read back, and the file is sound."""
    import engine.storage.database as database

    db = tmp_path / "c.db"
    with monkeypatch.context() as patch:  # the store as the previous version wrote it
        patch.setattr(database, "MIGRATIONS", database.MIGRATIONS[:2])
        patch.setattr(database, "SCHEMA_VERSION", 2)
        with Store(db) as old:
            cid = old.create(_tree("before tools"), title="old")
            with pytest.raises(ArborError, match="CHECK constraint"):
                tree = old.load(cid)
                tool = tree.add_child(tree.active_leaf, Role.TOOL, '{"rain": true}')
                old.save(cid, tree, [tool])
    with Store(db) as store:
        assert list(tmp_path.glob("c.db.v2-*.bak"))
        tree = store.load(cid)
        assert [n.text for n in tree.messages()] == ["before tools"]
        tool = tree.add_child(tree.active_leaf, Role.TOOL, '{"rain": true}')
        tool.meta["tool_call_id"] = "call_1"
        store.save(cid, tree, [tool])
        _sound(store)
    with Store(db) as store:
        (kept,) = [n for n in store.load(cid).nodes() if n.role is Role.TOOL]
        assert kept.text == '{"rain": true}' and kept.meta["tool_call_id"] == "call_1"


def test_disk_full_gives_a_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    with Store(tmp_path / "c.db") as store:
        cid = store.create(_tree("kept"), title="t")
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")
        big = _tree("x" * 2_000_000)
        with pytest.raises(StoreWriteError, match="the disk is full"):
            store.create(big, title="too big")
        assert [c.id for c in store.list()] == [cid]
        assert store.load(cid).message(0).text == "kept"
        assert store.integrity_ok()


class _FailingConnection:
    """Passes everything to SQLite but fails writes of nodes like a dying disk."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("INSERT INTO nodes ("):
            error = sqlite3.OperationalError("disk I/O error")
            error.sqlite_errorcode = sqlite3.SQLITE_IOERR_WRITE  # as SQLite raises it
            raise error
        return self.real.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_an_io_error_mid_action_rolls_the_whole_action_back(tmp_path: Path) -> None:
    with Store(tmp_path / "c.db") as store:
        cid = store.create(_tree("q", "r"), title="t")
        tree = store.load(cid)
        real = store._db
        store._db = _FailingConnection(real)  # type: ignore[assignment]
        new = tree.add_sibling(tree.message(0).id, "edited")
        with pytest.raises(StoreWriteError, match="the disk reported an I/O error"):
            store.save(cid, tree, [new])
        store._db = real
        reloaded = store.load(cid)
        assert [n.text for n in reloaded.messages()] == ["q", "r"]
        assert len(reloaded) == 3
        assert store.integrity_ok()


def test_write_errors_are_told_apart_by_their_code_not_their_text() -> None:
    error = sqlite3.OperationalError("database or disk is full (or so it says)")
    error.sqlite_errorcode = sqlite3.SQLITE_READONLY
    assert "the database is read-only" in str(_write_error(error))
    uncoded = sqlite3.OperationalError("something new")
    assert "something new" in str(_write_error(uncoded))


def test_conversations_deleted_over_30_days_ago_are_purged_when_the_store_opens(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    with Store(db) as store:
        old, recent, kept = (store.create(_tree(t), title=t) for t in ("old", "recent", "kept"))
        store.delete(old)
        store.delete(recent)
        store._db.execute("UPDATE conversations SET deleted_at = ? WHERE id = ?",
                          (time.time() - PURGE_AFTER_S - 60, old))
    with Store(db, recover=False) as second:  # a second connection (an import) purges nothing
        assert second._db.execute("SELECT COUNT(*) FROM conversations").fetchone()[0] == 3
    with Store(db) as store:
        ids = {r[0] for r in store._db.execute("SELECT id FROM conversations")}
        assert ids == {recent, kept}  # the recent one can still be undone
        store.undelete(recent)
        assert {c.id for c in store.list()} == {recent, kept}
        assert store.search("old") == []


def test_replay_persists_every_operation(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    db = tmp_path / "c.db"
    scenario = parse_scenario({
        "model": str(tiny_models["dense"]), "n_ctx": 1024, "n_batch": 64, "seed": 3,
        "steps": [
            {"op": "send", "text": "first", "max_tokens": 5},
            {"op": "send", "text": "second", "max_tokens": 5},
            {"op": "edit", "message": 0, "text": "first, edited", "max_tokens": 5},
            {"op": "regenerate", "max_tokens": 5},
            {"op": "switch", "message": 0, "variant": 0},
        ],
    })
    report = replay(scenario, db=db)
    with Store(db) as store:
        tree = store.load(report["conversation_id"])
    assert [n.text for n in tree.messages()] == [
        "first", report["steps"][0]["text"], "second", report["steps"][1]["text"],
    ]
    assert len(tree) == 1 + 4 + 1 + 2  # root, first branch, the edit and two replies
    assert all(n.status is NodeStatus.COMPLETE for n in tree.nodes())
    assert all(n.tokens for n in tree.nodes() if n.role is Role.ASSISTANT)


def test_a_failing_migration_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.storage.database as database

    db = tmp_path / "c.db"
    with sqlite3.connect(db) as raw:
        raw.execute("CREATE TABLE legacy (x)")

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (y)")
        raise sqlite3.OperationalError("simulated failure in migration 2")

    monkeypatch.setattr(database, "MIGRATIONS", [*database.MIGRATIONS, broken])
    monkeypatch.setattr(database, "SCHEMA_VERSION", len(database.MIGRATIONS))
    with pytest.raises(StoreOpenError, match="simulated failure"):
        Store(db)
    with sqlite3.connect(db) as raw:
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 0
    assert tables == {"legacy"}  # neither migration 1 nor the half of 2 was kept


# --- deep trees, sliced imports ------------------------------------------------------------


def _deep_tree(depth: int) -> Tree:
    """A conversation `depth` messages long, built in linear time."""
    nodes = [Node(id=0, parent=None, role=Role.SYSTEM, text="sys", created=0.0)]
    for i in range(1, depth + 1):
        nodes.append(Node(id=i, parent=i - 1, role=Role.USER if i % 2 else Role.ASSISTANT,
                          text=f"message {i}", created=float(i), last_active_child=None))
    return Tree.from_nodes(nodes, active_leaf=depth)


def _sound(store: Store) -> None:
    assert store.problems() == []


def test_a_20000_deep_conversation_can_be_purged(tmp_path: Path) -> None:
    with Store(tmp_path / "c.db") as store:
        kept = store.create(_tree("kept"), title="kept")
        deep = store.create(_deep_tree(20_000), title="deep")
        store.delete(deep)
        assert store.purge(older_than_s=0) == 1
        assert [c.id for c in store.list(include_deleted=True)] == [kept]
        assert store._db.execute("SELECT COUNT(*) FROM nodes").fetchone()[0] == 2
        assert store.search("message") == []
        _sound(store)


def test_a_20000_deep_branch_is_deleted_whole_from_its_top(tmp_path: Path) -> None:
    with Store(tmp_path / "c.db") as store:
        cid = store.create(_deep_tree(20_000), title="deep")
        tree = store.load(cid)
        gone = tree.delete_branch(3)
        # Given the top alone (the schema's cascade says the rest goes with it), the store
        # removes the whole branch and its search entries, however deep.
        store.save(cid, tree, [tree.node(2)], deleted=[3])
        assert len(gone) == 20_000 - 2
        assert _shape(store.load(cid)) == _shape(tree)
        assert [h.node_id for h in store.search("message")] == [1, 2]
        _sound(store)


def _records(count: int, messages: int) -> list[ConversationRecord]:
    return [from_tree(_deep_tree(messages), title=f"imported {i}") for i in range(count)]


def _contents(store: Store) -> list[Any]:
    """Everything a user can see or search, row by row."""
    return [store._db.execute(sql).fetchall() for sql in (
        "SELECT * FROM conversations ORDER BY id",
        "SELECT * FROM nodes ORDER BY conversation_id, id",
        "SELECT * FROM nodes_fts_map ORDER BY rowid",
        "SELECT rowid, text FROM nodes_fts ORDER BY rowid",
    )]


def test_an_import_lets_other_writers_in_between_its_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.storage.store as store_module

    monkeypatch.setattr(store_module, "IMPORT_SLICE", 100)
    db = tmp_path / "c.db"
    window = Store(db)
    window._db.execute("PRAGMA busy_timeout = 0")  # a write that had to wait fails at once
    mine = window.create(_tree("mine"), title="mine")
    importer = Store(db, recover=False)
    records = _records(10, 59)  # 60 messages each: 600, six slices
    seen: list[tuple[int, int]] = []
    sizes: list[int] = []

    def messages() -> int:
        return int(importer._db.execute("SELECT COUNT(*) FROM nodes").fetchone()[0])

    written = messages()

    def between(done: int, total: int) -> None:
        nonlocal written
        sizes.append(messages() - written)  # what the slice just committed wrote
        written = messages()
        seen.append((done, total))
        window.rename(mine, f"renamed {done}")  # the write lock is free
        assert [c.id for c in window.list()] == [mine]  # nothing shows before the end
        assert window.search("message") == []

    ids = importer.import_records(records, progress=between)
    assert seen == [(done, 600) for done in range(100, 700, 100)]
    assert sizes == [100] * 6
    assert window.list()[0].title == "renamed 600"
    assert {c.id for c in window.list()} == {mine, *ids}
    assert [len(window.load(cid)) for cid in ids] == [60] * 10
    _sound(window)
    importer.close()
    window.close()


def test_a_failed_import_leaves_the_store_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.storage.store as store_module

    monkeypatch.setattr(store_module, "IMPORT_SLICE", 100)
    real = Store._insert_new_nodes
    calls: list[int] = []

    def dying_disk(db: sqlite3.Connection, cid: int, nodes: Any) -> None:
        calls.append(cid)
        if len(calls) == 8:  # in the fourth slice
            error = sqlite3.OperationalError("disk I/O error")
            error.sqlite_errorcode = sqlite3.SQLITE_IOERR_WRITE
            raise error
        real(db, cid, nodes)

    slices: list[int] = []
    with Store(tmp_path / "c.db") as store:
        store.create(_tree("kept"), title="kept")
        before = _contents(store)
        monkeypatch.setattr(Store, "_insert_new_nodes", staticmethod(dying_disk))
        with pytest.raises(StoreWriteError, match="I/O error"):
            store.import_records(_records(10, 59), progress=lambda done, _: slices.append(done))
        assert slices == [100, 200, 300]  # three slices were committed before it failed
        assert _contents(store) == before
        _sound(store)


def test_a_killed_import_shows_nothing_and_is_cleaned_up_at_the_next_open(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    with Store(db) as store:
        store.create(_tree("kept"), title="kept")
        before = _contents(store)
    root = Path(__file__).resolve().parents[3]
    killed = subprocess.run(  # ten conversations; it dies after three slices of 100
        [sys.executable, "-m", "tests.crash_writer", str(db), "import"], cwd=root,
        capture_output=True, env={**os.environ, "PYTHONPATH": str(root)}, check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with Store(db, recover=False) as second:  # what another connection sees meanwhile
        # Three slices of 100 messages: five of the ten conversations, hidden.
        assert second._db.execute("SELECT COUNT(*) FROM conversations").fetchone()[0] == 6
        assert [c.title for c in second.list(include_deleted=True)] == ["kept"]
        assert second.search("message") == []
    with Store(db) as store:  # the program's own open removes the leftovers
        assert _contents(store) == before
        _sound(store)


def test_problems_finds_a_stale_search_index_and_dangling_rows(tmp_path: Path) -> None:
    with Store(tmp_path / "c.db") as store:
        cid = store.create(_tree("alpha", "beta", "gamma"), title="t")
        assert store.problems() == []
        db = store._db
        db.execute("UPDATE nodes_fts SET text = 'stale' WHERE rowid = "
                   "(SELECT rowid FROM nodes_fts_map WHERE node_id = 1)")
        db.execute("DELETE FROM nodes_fts_map WHERE node_id = 3")  # its text stays indexed
        db.execute("PRAGMA foreign_keys = OFF")
        db.execute("INSERT INTO nodes (conversation_id, id, parent_id, role, text, created, "
                   "status) VALUES (?, 9, 7, 'user', 'orphan', 0, 'complete')", (cid,))
        db.execute("PRAGMA foreign_keys = ON")
        assert sorted(store.problems()) == [
            "1 search entries that belong to no message",
            "1 search entries whose text is not their message's",
            "2 messages missing from the search index",
            "a row of nodes (rowid 5) points to a missing row of nodes",
        ]
        db.execute("UPDATE nodes_fts_data SET block = zeroblob(length(block)) WHERE id > 10")
        assert any("the search index is damaged" in p for p in store.problems())
        assert not store.integrity_ok()
