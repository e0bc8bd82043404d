"""The conversation database as a file: its schema, opening it, and its errors.

- WAL, `synchronous=FULL`, foreign keys.
- A schema version (`PRAGMA user_version`) and numbered migrations, applied in one
  transaction after a backup copy of the file. A file that is not an Arbor database, or is
  from a newer Arbor, is never written to: `StoreOpenError`, and the file stays as it was.
- Every write error (disk full, I/O error, read-only file) becomes `StoreWriteError` with a
  clear message (`write_error`), by SQLite's result code.
- `find_problems`: SQLite's own checks and the search index against the messages.

What is kept in it, and how, is `engine.storage.store`'s (with `engine.storage.rows`).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from engine.core.errors import ArborError
from engine.files.atomic import fsync_folder, make_folder

log = logging.getLogger(__name__)


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


def open_database(path: Path) -> sqlite3.Connection:
    """The conversation database at `path`, created or migrated; StoreOpenError, with the
    file left as it was, when it cannot be."""
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
            _migrate(db, path, version, existed)
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


def _migrate(db: sqlite3.Connection, path: Path, version: int, existed: bool) -> None:
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


def find_problems(db: sqlite3.Connection) -> list[str]:
    """What is wrong with the database, in words; empty when it is sound. SQLite's
    integrity check, the foreign keys, and the search index against the messages."""
    found = [row[0] for row in db.execute("PRAGMA integrity_check") if row[0] != "ok"]
    found += [f"a row of {table} (rowid {rowid}) points to a missing row of {parent}"
              for table, rowid, parent, _ in db.execute("PRAGMA foreign_key_check")]
    for what, sql in _INDEX_CHECKS:
        count = db.execute(sql).fetchone()[0]
        if count:
            found.append(f"{count} {what}")
    try:  # FTS5's own check of its index against its text; it writes nothing
        db.execute("INSERT INTO nodes_fts (nodes_fts, rank) VALUES ('integrity-check', 1)")
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_CORRUPT:
            raise StoreError(f"cannot check the search index: {exc}") from exc
        found.append(f"the search index is damaged ({exc})")
    return found


_WRITE_REASONS = {
    sqlite3.SQLITE_FULL: "the disk is full",
    sqlite3.SQLITE_READONLY: "the database is read-only",
    sqlite3.SQLITE_IOERR: "the disk reported an I/O error",
    sqlite3.SQLITE_CANTOPEN: "the database file could not be opened",
}


def write_error(exc: sqlite3.Error) -> StoreWriteError:
    """Classified by SQLite's primary result code (extended codes carry it in the low byte),
    never by the message text."""
    code = getattr(exc, "sqlite_errorcode", None)
    reason = _WRITE_REASONS.get(code & 0xFF) if isinstance(code, int) else None
    reason = reason or str(exc)
    return StoreWriteError(f"could not save the conversation: {reason}; nothing saved before "
                           f"was lost")


__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "StoreError",
    "StoreOpenError",
    "StoreWriteError",
    "find_problems",
    "open_database",
    "write_error",
]
