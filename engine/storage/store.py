"""SQLite persistence of conversation trees, to the standard of software people trust.

- One transaction per user action; any error in it rolls it back and becomes
  `StoreWriteError`, so nothing already saved is lost.
- A reply that was streaming when the process died reopens as interrupted.
- An import writes in slices of `IMPORT_SLICE` messages, each its own short transaction, so
  the window's writes never wait long; its conversations stay hidden until one last small
  transaction shows them all. What a failed or killed import left is removed.

The file itself (schema, migrations, opening, errors) is `engine.storage.database`'s; the SQL
of node rows and their search index is `engine.storage.rows`'.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.conversation import Conversation
from engine.core.records import ConversationRecord, from_tree, to_tree
from engine.core.tree import Node, Tree
from engine.files.paths import data_dirs
from engine.storage.database import (
    StoreError,
    StoreWriteError,
    find_problems,
    open_database,
    write_error,
)
from engine.storage.rows import (
    delete_conversation,
    delete_nodes,
    index_text,
    insert_conversation,
    insert_new_nodes,
    node_from_row,
    write_nodes,
)

log = logging.getLogger(__name__)

DB_NAME = "conversations.db"
PURGE_AFTER_S = 30 * 24 * 3600  # soft-deleted conversations are purged after 30 days
IMPORT_SLICE = 5_000  # messages an import writes per transaction: what a GUI write may wait


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
        self._db = open_database(self.path)
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
            raise write_error(exc) from exc
        try:
            yield self._db
            if self._cancel is not None and self._cancel():
                raise StoreWriteError("the write was cancelled; nothing was saved")
            self._db.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise write_error(exc) from exc
            raise

    # --- conversations -----------------------------------------------------------------

    def create(self, tree: Tree, *, title: str = "New conversation",
               settings: dict[str, Any] | None = None,
               model: dict[str, Any] | None = None) -> int:
        """Save a whole tree as a new conversation, in one transaction."""
        now = time.time()
        with self._tx() as db:
            conversation_id = insert_conversation(
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
                delete_nodes(db, conversation_id, deleted)
            write_nodes(db, conversation_id, list(written.values()))
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
            index_text(db, conversation_id, node.id, node.text)

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
        return Tree.from_nodes([node_from_row(r) for r in rows], active_leaf=conversation[0])

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
                            ids.append(insert_conversation(
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
            delete_conversation(db, conversation_id)

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
                delete_conversation(db, conversation_id)
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
        """What is wrong with the database, in words (see `find_problems`); empty when it is
        sound."""
        return find_problems(self._db)

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

    # New nodes in bulk (engine.storage.rows); an attribute, so that a test can make one
    # slice of an import fail.
    _insert_new_nodes = staticmethod(insert_new_nodes)

    def _discard_pending(self, token: str | None) -> int:
        """Remove the hidden conversations of the import `token` (None: of any import), one
        transaction each, so that nothing waits long. Returns how many went."""
        where, args = (("pending = ?", (token,)) if token is not None
                       else ("pending IS NOT NULL", ()))
        doomed = [row[0] for row in self._db.execute(
            f"SELECT id FROM conversations WHERE {where}", args)]
        for conversation_id in doomed:
            with self._tx() as db:
                delete_conversation(db, conversation_id)
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



__all__ = [
    "ConversationInfo",
    "SearchHit",
    "Store",
]
