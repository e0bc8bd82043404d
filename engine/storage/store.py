"""SQLite persistence of conversation trees, to the standard of software people trust.

- WAL, `synchronous=FULL`, foreign keys; one transaction per user action.
- A schema version (`PRAGMA user_version`) and numbered migrations, applied in one
  transaction after a backup copy of the file. A file that is not an Arbor database, or is
  from a newer Arbor, is never written to: `StoreOpenError`, and the file stays as it was.
- Every write error (disk full, I/O error, read-only file) becomes `StoreWriteError` with a
  clear message; the transaction is rolled back, so nothing already saved is lost.
- A reply that was streaming when the process died reopens as interrupted.
- An import writes in slices of `IMPORT_SLICE` messages, each its own short transaction, so
  the window's writes never wait long; its conversations stay hidden until one last small
  transaction shows them all. What a failed or killed import left is removed.
- A branch, however deep, is deleted without SQLite's cascade (which recurses once per
  generation and stops at 1,000 levels).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import secrets
import sqlite3
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.conversation import Conversation
from engine.core.errors import ArborError
from engine.core.records import ConversationRecord, from_tree, to_tree
from engine.core.tree import Node, NodeStatus, Role, Tree
from engine.files.atomic import fsync_folder, make_folder
from engine.files.paths import data_dirs

log = logging.getLogger(__name__)

DB_NAME = "conversations.db"
PURGE_AFTER_S = 30 * 24 * 3600  # soft-deleted conversations are purged after 30 days
IMPORT_SLICE = 5_000  # messages an import writes per transaction: what a GUI write may wait


class StoreError(ArborError):
    """A problem with the conversation database."""


class StoreOpenError(StoreError):
    """The database cannot be opened or migrated; the file was left untouched."""


class StoreWriteError(StoreError):
    """A change could not be saved (disk full, I/O error); nothing saved before is lost."""


def _migration_1(db: sqlite3.Connection) -> None:
    # Statement by statement: executescript() would COMMIT the migration's transaction.
    _run_script(
        db,
        """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            created REAL NOT NULL,
            updated REAL NOT NULL,
            deleted_at REAL,
            active_leaf INTEGER,
            settings TEXT NOT NULL DEFAULT '{}',
            model TEXT
        );
        CREATE TABLE nodes (
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            id INTEGER NOT NULL,
            parent_id INTEGER,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            text TEXT NOT NULL,
            tokens BLOB,
            created REAL NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('complete', 'streaming', 'interrupted')),
            last_active_child INTEGER,
            meta TEXT NOT NULL DEFAULT '{}',
            PRIMARY KEY (conversation_id, id),
            FOREIGN KEY (conversation_id, parent_id) REFERENCES nodes(conversation_id, id)
                ON DELETE CASCADE
        );
        CREATE INDEX nodes_parent ON nodes(conversation_id, parent_id);
        CREATE VIRTUAL TABLE nodes_fts USING fts5(text);
        CREATE TABLE nodes_fts_map (
            rowid INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL,
            node_id INTEGER NOT NULL,
            UNIQUE (conversation_id, node_id)
        );
        """
    )


def _run_script(db: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _migration_2(db: sqlite3.Connection) -> None:
    # An import's conversations carry its token here, hidden, until all of them are written.
    db.execute("ALTER TABLE conversations ADD COLUMN pending TEXT")


_ROLES_BEFORE_TOOLS = "CHECK (role IN ('system', 'user', 'assistant'))"
_ROLES_WITH_TOOLS = "CHECK (role IN ('system', 'user', 'assistant', 'tool'))"


def _migration_3(db: sqlite3.Connection) -> None:
    # Tool results are nodes of their own role (engine.core.tools). SQLite cannot alter a
    # CHECK constraint; one that only allows more changes no stored row, so its text in the
    # schema is replaced in place, as SQLite's documentation describes for such changes.
    db.execute("PRAGMA writable_schema = ON")
    try:
        db.execute("UPDATE sqlite_schema SET sql = replace(sql, ?, ?) "
                   "WHERE type = 'table' AND name = 'nodes'",
                   (_ROLES_BEFORE_TOOLS, _ROLES_WITH_TOOLS))
        (cookie,) = db.execute("PRAGMA schema_version").fetchone()
        db.execute(f"PRAGMA schema_version = {int(cookie) + 1}")  # the schema is read again
    finally:
        db.execute("PRAGMA writable_schema = OFF")
    (sql,) = db.execute("SELECT sql FROM sqlite_schema WHERE name = 'nodes'").fetchone()
    if _ROLES_WITH_TOOLS not in sql:
        raise sqlite3.DatabaseError("the nodes table's role check was not the one expected")


# Numbered migrations: MIGRATIONS[i] brings the schema from version i to i + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migration_1, _migration_2,
                                                          _migration_3]
SCHEMA_VERSION = len(MIGRATIONS)


# The columns of a ConversationInfo; the count leaves out the system root.
_INFO_COLUMNS = (
    "c.id, c.title, c.created, c.updated, c.deleted_at, "
    "(SELECT COUNT(*) FROM nodes n WHERE n.conversation_id = c.id) - 1"
)


@dataclass(frozen=True)
class ConversationInfo:
    id: int
    title: str
    created: float
    updated: float
    deleted_at: float | None
    messages: int


@dataclass(frozen=True)
class SearchHit:
    conversation_id: int
    node_id: int
    title: str
    snippet: str


class Store:
    """One SQLite database of conversations. Not shared between threads: the GUI thread
    owns it (the engine, in its own process, never writes conversations)."""

    def __init__(self, path: Path | None = None, *, recover: bool = True) -> None:
        """Open (and create or migrate) the database. `recover` marks replies left streaming
        by a crash as interrupted and removes what an unfinished import left: right for the
        program's own connection, wrong for a second one opened while the first may be
        streaming a reply or importing (a background import, another Arbor process)."""
        self.path = path or data_dirs().data / DB_NAME
        self._cancel: Callable[[], bool] | None = None
        self._db = self._open(self.path)
        if recover:
            self._recover_streaming()
            discarded = self._discard_pending(None)
            if discarded:
                log.info("removed %d conversations of an unfinished import", discarded)
            purged = self.purge()  # the promise: deleted conversations go after 30 days
            if purged:
                log.info("purged %d conversations deleted over 30 days ago", purged)

    def close(self) -> None:
        self._db.close()

    def interrupt_when(self, cancel: Callable[[], bool] | None) -> None:
        """While set, a transaction stops once `cancel()` is true: inside a long statement
        (SQLite's progress handler, polled every 10,000 virtual-machine steps) or, at the
        latest, before its COMMIT. It rolls back and the call raises StoreWriteError."""
        self._cancel = cancel
        if cancel is None:
            self._db.set_progress_handler(None, 0)
        else:
            self._db.set_progress_handler(lambda: 1 if cancel() else 0, 10_000)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- opening -----------------------------------------------------------------------

    def _open(self, path: Path) -> sqlite3.Connection:
        existed = path.exists() and path.stat().st_size > 0
        if existed:
            _check_header(path)
        try:
            make_folder(path.parent)
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
        except (OSError, sqlite3.Error) as exc:
            raise StoreOpenError(f"cannot open the conversation database {path}: {exc}") from exc
        try:
            db.execute("PRAGMA foreign_keys = ON")
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StoreOpenError(
                    f"{path.name} was written by a newer Arbor (schema {version}, this one "
                    f"knows {SCHEMA_VERSION}); it was left untouched"
                )
            if version < SCHEMA_VERSION:
                self._migrate(db, path, version, existed)
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("the database could not switch to WAL (mode %s)", mode)
            # In WAL, FULL syncs the log at every COMMIT: what the user was told is saved
            # survives a power cut (NORMAL syncs only at checkpoints).
            db.execute("PRAGMA synchronous = FULL")
            db.execute("PRAGMA busy_timeout = 5000")
            if not existed:
                fsync_folder(path.parent)  # the new file's name; SQLite syncs its contents
        except StoreOpenError:
            db.close()
            raise
        except sqlite3.Error as exc:
            db.close()
            raise StoreOpenError(
                f"cannot open the conversation database {path.name}: {exc}; it was left "
                f"untouched"
            ) from exc
        return db

    def _migrate(self, db: sqlite3.Connection, path: Path, version: int, existed: bool) -> None:
        if existed:
            backup = path.with_name(f"{path.name}.v{version}-{int(time.time())}.bak")
            try:
                with contextlib.closing(sqlite3.connect(backup)) as target:
                    db.backup(target)
            except sqlite3.Error as exc:
                raise StoreOpenError(
                    f"cannot back up {path.name} before upgrading it ({exc}); it was left "
                    f"untouched"
                ) from exc
            log.info("backed up %s to %s before migrating", path.name, backup.name)
        db.execute("BEGIN IMMEDIATE")
        try:
            for step in range(version, SCHEMA_VERSION):
                MIGRATIONS[step](db)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _recover_streaming(self) -> None:
        """Replies that were streaming when the process died are interrupted, not lost."""
        with self._tx():
            self._db.execute(
                "UPDATE nodes SET status = 'interrupted' WHERE status = 'streaming'"
            )

    # --- transactions ------------------------------------------------------------------

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction; any SQLite error rolls it back and becomes StoreWriteError."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _write_error(exc) from exc
        try:
            yield self._db
            if self._cancel is not None and self._cancel():
                raise StoreWriteError("the write was cancelled; nothing was saved")
            self._db.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _write_error(exc) from exc
            raise

    # --- conversations -----------------------------------------------------------------

    def create(self, tree: Tree, *, title: str = "New conversation",
               settings: dict[str, Any] | None = None,
               model: dict[str, Any] | None = None) -> int:
        """Save a whole tree as a new conversation, in one transaction."""
        now = time.time()
        with self._tx() as db:
            conversation_id = self._insert_conversation(
                db, tree, title=title, created=now, updated=now, settings=settings or {},
                model=model,
            )
            self._insert_new_nodes(db, conversation_id, list(tree.nodes()))
        return conversation_id

    def save(self, conversation_id: int, tree: Tree, nodes: Sequence[Node] = (),
             *, deleted: Sequence[int] = ()) -> None:
        """One user action: write the given nodes (new or changed), the last-active
        pointers of the active path, the active leaf and deletions, in one transaction."""
        written = {n.id: n for n in nodes if n.id in tree}
        # The rest of the active path changes at most its last-active pointer: one cheap
        # UPDATE each (rows already right are left alone), no rewrite, no re-index.
        pointers = [(n.last_active_child, conversation_id, n.id)
                    for n in tree.active_path() if n.id not in written]
        with self._tx() as db:
            self._require(db, conversation_id)
            if deleted:
                self._delete_nodes(db, conversation_id, deleted)
            self._write_nodes(db, conversation_id, list(written.values()))
            db.executemany(
                "UPDATE nodes SET last_active_child = ? WHERE conversation_id = ? AND id = ? "
                "AND last_active_child IS NOT ?",
                [(*row, row[0]) for row in pointers],
            )
            db.execute(
                "UPDATE conversations SET active_leaf = ?, updated = ? WHERE id = ?",
                (tree.active_leaf, time.time(), conversation_id),
            )

    def update_text(self, conversation_id: int, node: Node) -> None:
        """Save a growing reply (its text and status) in a small transaction."""
        with self._tx() as db:
            db.execute(
                "UPDATE nodes SET text = ?, status = ? WHERE conversation_id = ? AND id = ?",
                (node.text, node.status.value, conversation_id, node.id),
            )
            self._index_text(db, conversation_id, node.id, node.text)

    def load(self, conversation_id: int) -> Tree:
        rows = self._db.execute(
            "SELECT id, parent_id, role, text, tokens, created, status, last_active_child, "
            "meta FROM nodes WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        conversation = self._db.execute(
            "SELECT active_leaf FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if conversation is None or not rows:
            raise StoreError(f"conversation {conversation_id} does not exist")
        return Tree.from_nodes([_node_from_row(r) for r in rows], active_leaf=conversation[0])

    def record(self, conversation_id: int) -> ConversationRecord:
        """The conversation as a record (for export)."""
        info = self._info(conversation_id)
        row = self._db.execute(
            "SELECT settings, model FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        tree = self.load(conversation_id)
        return from_tree(
            tree, title=info.title, created=info.created,
            settings=json.loads(row[0]), model=json.loads(row[1]) if row[1] else None,
        )

    def import_records(
        self, records: Sequence[ConversationRecord], *, trees: Sequence[Tree] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> builtins.list[int]:
        """Add conversations from a file: all of them or, on any error, none. `trees`, when
        given, are `to_tree(record)` for each record, built beforehand (off the thread that
        owns the store).

        Written in slices of `IMPORT_SLICE` messages, one transaction each, so that another
        connection's write waits for one slice at most, never for the whole file. The
        conversations stay hidden until a last transaction shows them all at once. On an
        error what was written is removed; what a cancelled or killed import left, hidden,
        goes when the store is next opened with `recover`. `progress(done, total)` (in
        messages) is called between slices, outside any transaction."""
        if trees is None:
            trees = [to_tree(record) for record in records]  # validates each record
        if len(trees) != len(records):
            raise ValueError("one tree per record")
        token = secrets.token_hex(8)
        ids: builtins.list[int] = []
        total, done = sum(len(tree) for tree in trees), 0
        try:
            for pieces in _slices(trees, IMPORT_SLICE):
                with self._tx() as db:
                    for index, nodes in pieces:
                        if index == len(ids):  # the first slice of this conversation
                            record, now = records[index], time.time()
                            ids.append(self._insert_conversation(
                                db, trees[index], title=record.title,
                                created=record.created or now, updated=record.updated or now,
                                settings=record.settings, model=record.model, pending=token,
                            ))
                        self._insert_new_nodes(db, ids[index], nodes)
                done += sum(len(nodes) for _, nodes in pieces)
                if progress is not None:
                    progress(done, total)
            with self._tx() as db:
                shown = db.execute("UPDATE conversations SET pending = NULL WHERE pending = ?",
                                   (token,)).rowcount
                if shown != len(ids):
                    raise StoreWriteError("the import was cut short: another Arbor opened the "
                                          "database meanwhile; nothing was imported")
        except BaseException:
            with contextlib.suppress(StoreError):  # else it goes at the next open
                self._discard_pending(token)
            raise
        return ids

    def list(self, *, include_deleted: bool = False) -> list[ConversationInfo]:
        """Conversations, most recently updated first."""
        where = "WHERE c.pending IS NULL" + ("" if include_deleted
                                             else " AND c.deleted_at IS NULL")
        rows = self._db.execute(
            f"SELECT {_INFO_COLUMNS} FROM conversations c {where} "
            "ORDER BY c.updated DESC, c.id DESC"
        ).fetchall()
        return [ConversationInfo(*row) for row in rows]

    def title(self, conversation_id: int) -> str:
        row = self._db.execute("SELECT title FROM conversations WHERE id = ?",
                               (conversation_id,)).fetchone()
        if row is None:
            raise StoreError(f"there is no conversation {conversation_id}")
        return str(row[0])

    def exists(self, conversation_id: int) -> bool:
        """A conversation that is there and not in the bin."""
        return self._db.execute(
            "SELECT 1 FROM conversations WHERE id = ? AND pending IS NULL "
            "AND deleted_at IS NULL", (conversation_id,)).fetchone() is not None

    def find_api_tree(self, key: str) -> int | None:
        """The newest conversation (not in the bin) the local API keeps under `key`."""
        row = self._db.execute(
            "SELECT id FROM conversations WHERE pending IS NULL AND deleted_at IS NULL "
            "AND json_extract(settings, '$.api_tree') = ? ORDER BY id DESC LIMIT 1",
            (key,)).fetchone()
        return int(row[0]) if row is not None else None

    def settings(self, conversation_id: int) -> dict[str, Any]:
        """The conversation's own settings (a JSON object; see engine.config.overrides)."""
        row = self._db.execute("SELECT settings FROM conversations WHERE id = ?",
                               (conversation_id,)).fetchone()
        if row is None:
            raise StoreError(f"conversation {conversation_id} does not exist")
        try:
            value = json.loads(row[0])
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def set_settings(self, conversation_id: int, settings: dict[str, Any]) -> None:
        with self._tx() as db:
            self._require(db, conversation_id)
            db.execute("UPDATE conversations SET settings = ? WHERE id = ?",
                       (json.dumps(settings), conversation_id))

    def rename(self, conversation_id: int, title: str) -> None:
        with self._tx() as db:
            self._require(db, conversation_id)
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete(self, conversation_id: int) -> None:
        """Soft delete: hidden from the list and search, restorable with `undelete`."""
        with self._tx() as db:
            self._require(db, conversation_id)
            db.execute(
                "UPDATE conversations SET deleted_at = ? WHERE id = ?",
                (time.time(), conversation_id),
            )

    def discard(self, conversation_id: int) -> None:
        """Remove a conversation for good (one the local API made for a request that got no
        reply: it never was the user's)."""
        with self._tx() as db:
            self._delete_conversation(db, conversation_id)

    def undelete(self, conversation_id: int) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE conversations SET deleted_at = NULL WHERE id = ?", (conversation_id,)
            )

    def purge(self, *, older_than_s: float = PURGE_AFTER_S) -> int:
        """Remove soft-deleted conversations for good once they are old enough."""
        cutoff = time.time() - older_than_s
        with self._tx() as db:
            doomed = [r[0] for r in db.execute(
                "SELECT id FROM conversations WHERE deleted_at IS NOT NULL AND deleted_at <= ?",
                (cutoff,),
            )]
            for conversation_id in doomed:
                self._delete_conversation(db, conversation_id)
        return len(doomed)

    def fork(self, conversation_id: int, node_id: int, *, title: str | None = None) -> int:
        """A new conversation holding the path from the root to `node_id`."""
        tree = Conversation(self.load(conversation_id)).fork(node_id)
        return self.create(tree, title=title or self.fork_title(conversation_id))

    def fork_title(self, conversation_id: int) -> str:
        return f"{self._info(conversation_id).title} (fork)"

    def search(self, query: str, *, limit: int = 50) -> builtins.list[SearchHit]:
        """Full-text search over message text (FTS5), deleted conversations excluded."""
        terms = " ".join('"' + word.replace('"', '""') + '"' for word in query.split())
        if not terms:
            return []
        rows = self._db.execute(
            "SELECT m.conversation_id, m.node_id, c.title, "
            "snippet(nodes_fts, 0, '[', ']', '…', 12) "
            "FROM nodes_fts JOIN nodes_fts_map m ON m.rowid = nodes_fts.rowid "
            "JOIN conversations c ON c.id = m.conversation_id "
            "WHERE nodes_fts MATCH ? AND c.deleted_at IS NULL AND c.pending IS NULL "
            "ORDER BY c.updated DESC, rank LIMIT ?",
            (terms, limit),
        ).fetchall()
        return [SearchHit(*row) for row in rows]

    def integrity_ok(self) -> bool:
        return not self.problems()

    def problems(self) -> builtins.list[str]:
        """What is wrong with the database, in words; empty when it is sound. SQLite's
        integrity check, the foreign keys, and the search index against the messages."""
        found = [row[0] for row in self._db.execute("PRAGMA integrity_check")
                 if row[0] != "ok"]
        found += [f"a row of {table} (rowid {rowid}) points to a missing row of {parent}"
                  for table, rowid, parent, _ in self._db.execute("PRAGMA foreign_key_check")]
        for what, sql in _INDEX_CHECKS:
            count = self._db.execute(sql).fetchone()[0]
            if count:
                found.append(f"{count} {what}")
        try:  # FTS5's own check of its index against its text; it writes nothing
            self._db.execute("INSERT INTO nodes_fts (nodes_fts, rank) "
                             "VALUES ('integrity-check', 1)")
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_CORRUPT:
                raise StoreError(f"cannot check the search index: {exc}") from exc
            found.append(f"the search index is damaged ({exc})")
        return found

    # --- internals ---------------------------------------------------------------------

    def _info(self, conversation_id: int) -> ConversationInfo:
        row = self._db.execute(
            f"SELECT {_INFO_COLUMNS} FROM conversations c WHERE c.id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise StoreError(f"conversation {conversation_id} does not exist")
        return ConversationInfo(*row)

    @staticmethod
    def _require(db: sqlite3.Connection, conversation_id: int) -> None:
        if db.execute("SELECT 1 FROM conversations WHERE id = ?",
                      (conversation_id,)).fetchone() is None:
            raise StoreError(f"conversation {conversation_id} does not exist")

    def _write_nodes(self, db: sqlite3.Connection, conversation_id: int,
                     nodes: Sequence[Node]) -> None:
        # Parents first, so the foreign key to the parent row always holds.
        for node in sorted(nodes, key=lambda n: n.id):
            db.execute(
                "INSERT INTO nodes (conversation_id, id, parent_id, role, text, tokens, "
                "created, status, last_active_child, meta) VALUES (?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (conversation_id, id) DO UPDATE SET text = excluded.text, "
                "tokens = excluded.tokens, status = excluded.status, "
                "last_active_child = excluded.last_active_child, meta = excluded.meta",
                (conversation_id, node.id, node.parent, node.role.value, node.text,
                 _pack_tokens(node.tokens), node.created, node.status.value,
                 node.last_active_child, json.dumps(node.meta)),
            )
            self._index_text(db, conversation_id, node.id, node.text)

    @staticmethod
    def _insert_conversation(db: sqlite3.Connection, tree: Tree, *, title: str,
                             created: float, updated: float, settings: dict[str, Any],
                             model: dict[str, Any] | None, pending: str | None = None) -> int:
        cursor = db.execute(
            "INSERT INTO conversations (title, created, updated, active_leaf, settings, model, "
            "pending) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (title, created, updated, tree.active_leaf, json.dumps(settings),
             json.dumps(model) if model is not None else None, pending),
        )
        return int(cursor.lastrowid or 0)

    @staticmethod
    def _insert_new_nodes(db: sqlite3.Connection, conversation_id: int,
                          nodes: Sequence[Node]) -> None:
        """New nodes whose parents are saved or among them, and their search index, in
        bulk: an import of 30,000 messages is a handful of statements, not 120,000."""
        ordered = sorted(nodes, key=lambda n: n.id)  # parents first: the foreign key holds
        # Search entries get rowids above every existing one (INTEGER PRIMARY KEY).
        first = db.execute("SELECT COALESCE(MAX(rowid), 0) FROM nodes_fts_map").fetchone()[0]
        db.executemany(
            "INSERT INTO nodes (conversation_id, id, parent_id, role, text, tokens, created, "
            "status, last_active_child, meta) VALUES (?,?,?,?,?,?,?,?,?,?)",
            [(conversation_id, n.id, n.parent, n.role.value, n.text, _pack_tokens(n.tokens),
              n.created, n.status.value, n.last_active_child, json.dumps(n.meta))
             for n in ordered],
        )
        db.executemany(
            "INSERT INTO nodes_fts_map (conversation_id, node_id) VALUES (?, ?)",
            [(conversation_id, n.id) for n in ordered],
        )
        db.execute(
            "INSERT INTO nodes_fts (rowid, text) SELECT m.rowid, n.text FROM nodes_fts_map m "
            "JOIN nodes n ON n.conversation_id = m.conversation_id AND n.id = m.node_id "
            "WHERE m.rowid > ?",
            (first,),
        )

    def _index_text(self, db: sqlite3.Connection, conversation_id: int, node_id: int,
                    text: str) -> None:
        row = db.execute(
            "SELECT rowid FROM nodes_fts_map WHERE conversation_id = ? AND node_id = ?",
            (conversation_id, node_id),
        ).fetchone()
        if row is not None:
            db.execute("UPDATE nodes_fts SET text = ? WHERE rowid = ?", (text, row[0]))
            return
        cursor = db.execute(
            "INSERT INTO nodes_fts_map (conversation_id, node_id) VALUES (?, ?)",
            (conversation_id, node_id),
        )
        db.execute("INSERT INTO nodes_fts (rowid, text) VALUES (?, ?)", (cursor.lastrowid, text))

    @staticmethod
    def _delete_nodes(db: sqlite3.Connection, conversation_id: int,
                      node_ids: Sequence[int]) -> None:
        """Delete nodes with everything under them (the schema's cascade promises as much),
        and their search entries. The branch is gathered breadth first (SQLite runs a
        recursive query from a queue, with no depth limit)."""
        doomed = [row[0] for row in db.execute(
            "WITH RECURSIVE doomed(id) AS (SELECT value FROM json_each(?) "
            "UNION SELECT n.id FROM nodes n JOIN doomed d "
            "ON n.conversation_id = ? AND n.parent_id = d.id) SELECT id FROM doomed",
            (json.dumps(list(node_ids)), conversation_id),
        )]
        Store._delete_rows(db, conversation_id, doomed)

    @staticmethod
    def _delete_conversation(db: sqlite3.Connection, conversation_id: int) -> None:
        doomed = [row[0] for row in db.execute(
            "SELECT id FROM nodes WHERE conversation_id = ?", (conversation_id,))]
        Store._delete_rows(db, conversation_id, doomed)
        db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    @staticmethod
    def _delete_rows(db: sqlite3.Connection, conversation_id: int,
                     node_ids: Sequence[int]) -> None:
        """Delete these nodes, every descendant of each among them, and their search
        entries. Each is cut from its parent first: deleting a parent would make SQLite
        cascade down its branch one trigger level per generation, and it stops at 1,000."""
        rows = [(conversation_id, node_id) for node_id in node_ids]
        db.executemany(
            "DELETE FROM nodes_fts WHERE rowid = (SELECT rowid FROM nodes_fts_map "
            "WHERE conversation_id = ? AND node_id = ?)", rows,
        )
        db.executemany("DELETE FROM nodes_fts_map WHERE conversation_id = ? AND node_id = ?",
                       rows)
        db.executemany("UPDATE nodes SET parent_id = NULL WHERE conversation_id = ? AND id = ?",
                       rows)
        db.executemany("DELETE FROM nodes WHERE conversation_id = ? AND id = ?", rows)

    def _discard_pending(self, token: str | None) -> int:
        """Remove the hidden conversations of the import `token` (None: of any import), one
        transaction each, so that nothing waits long. Returns how many went."""
        where, args = (("pending = ?", (token,)) if token is not None
                       else ("pending IS NOT NULL", ()))
        doomed = [row[0] for row in self._db.execute(
            f"SELECT id FROM conversations WHERE {where}", args)]
        for conversation_id in doomed:
            with self._tx() as db:
                self._delete_conversation(db, conversation_id)
        return len(doomed)


def _slices(trees: Sequence[Tree], size: int) -> Iterator[list[tuple[int, list[Node]]]]:
    """The nodes of `trees`, parents first, in slices of `size`; each slice is a list of
    (index of the tree, some of its nodes)."""
    pieces: list[tuple[int, list[Node]]] = []
    room = size
    for index, tree in enumerate(trees):
        nodes = sorted(tree.nodes(), key=lambda n: n.id)
        start = 0
        while start < len(nodes):
            part = nodes[start:start + room]
            pieces.append((index, part))
            start += len(part)
            room -= len(part)
            if room == 0:
                yield pieces
                pieces, room = [], size
    if pieces:
        yield pieces


class StoreSink:
    """Connects a Session to the store: one transaction per action, a streaming reply saved
    at most `interval_s` behind."""

    def __init__(self, store: Store, conversation_id: int, *, interval_s: float = 1.0) -> None:
        self.store = store
        self.conversation_id = conversation_id
        self.interval_s = interval_s
        self._last = 0.0

    def action(self, tree: Tree, nodes: Sequence[Node], deleted: Sequence[int] = ()) -> None:
        self.store.save(self.conversation_id, tree, nodes, deleted=deleted)
        self._last = time.monotonic()

    def forked(self, tree: Tree) -> StoreSink:
        """A fork is a new conversation in the same store."""
        cid = self.store.create(tree, title=self.store.fork_title(self.conversation_id))
        return StoreSink(self.store, cid, interval_s=self.interval_s)

    def streaming(self, node: Node) -> None:
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self.store.update_text(self.conversation_id, node)
            self._last = now


def _check_header(path: Path) -> None:
    """Refuse, without writing, a file that is not an SQLite database."""
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise StoreOpenError(f"cannot read the conversation database {path}: {exc}") from exc
    if head != b"SQLite format 3\x00":
        raise StoreOpenError(
            f"{path.name} is not an Arbor conversation database (damaged or another file); "
            f"it was left untouched"
        )


# The search index against the messages: (what is wrong, how many rows are).
_INDEX_CHECKS = (
    ("messages missing from the search index",
     "SELECT COUNT(*) FROM nodes n WHERE NOT EXISTS (SELECT 1 FROM nodes_fts_map m "
     "WHERE m.conversation_id = n.conversation_id AND m.node_id = n.id)"),
    ("search entries for messages that do not exist",
     "SELECT COUNT(*) FROM nodes_fts_map m WHERE NOT EXISTS (SELECT 1 FROM nodes n "
     "WHERE n.conversation_id = m.conversation_id AND n.id = m.node_id)"),
    ("search entries whose text is not their message's",
     "SELECT COUNT(*) FROM nodes_fts_map m JOIN nodes n ON n.conversation_id = "
     "m.conversation_id AND n.id = m.node_id LEFT JOIN nodes_fts f ON f.rowid = m.rowid "
     "WHERE f.text IS NOT n.text"),
    ("search entries that belong to no message",
     "SELECT COUNT(*) FROM nodes_fts f WHERE f.rowid NOT IN (SELECT rowid FROM nodes_fts_map)"),
)

_WRITE_REASONS = {
    sqlite3.SQLITE_FULL: "the disk is full",
    sqlite3.SQLITE_READONLY: "the database is read-only",
    sqlite3.SQLITE_IOERR: "the disk reported an I/O error",
    sqlite3.SQLITE_CANTOPEN: "the database file could not be opened",
}


def _write_error(exc: sqlite3.Error) -> StoreWriteError:
    """Classified by SQLite's primary result code (extended codes carry it in the low byte),
    never by the message text."""
    code = getattr(exc, "sqlite_errorcode", None)
    reason = _WRITE_REASONS.get(code & 0xFF) if isinstance(code, int) else None
    reason = reason or str(exc)
    return StoreWriteError(f"could not save the conversation: {reason}; nothing saved before "
                           f"was lost")


def _pack_tokens(tokens: tuple[int, ...] | None) -> bytes | None:
    return None if tokens is None else array("i", tokens).tobytes()


def _unpack_tokens(blob: bytes | None) -> tuple[int, ...] | None:
    if blob is None:
        return None
    values = array("i")
    values.frombytes(blob)
    return tuple(values)


def _node_from_row(row: tuple[Any, ...]) -> Node:
    node_id, parent, role, text, tokens, created, status, last_active, meta = row
    return Node(
        id=node_id, parent=parent, role=Role(role), text=text, created=created,
        tokens=_unpack_tokens(tokens), status=NodeStatus(status),
        last_active_child=last_active, meta=json.loads(meta),
    )


__all__ = [
    "ConversationInfo",
    "SearchHit",
    "Store",
    "StoreError",
    "StoreOpenError",
    "StoreWriteError",
]
