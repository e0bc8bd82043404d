"""The rows of a conversation's messages and their search entries, as SQL.

Writing nodes (one by one, or new ones in bulk), keeping each node's text in the full-text
index (`nodes_fts`, through `nodes_fts_map`), deleting nodes and whole conversations, and
reading a node back from its row. Every function runs inside a transaction the caller holds
(`engine.storage.store`). A branch, however deep, is deleted without SQLite's cascade (which
recurses once per generation and stops at 1,000 levels).
"""

from __future__ import annotations

import json
import sqlite3
from array import array
from collections.abc import Sequence
from typing import Any

from engine.core.tree import Node, NodeStatus, Role, Tree


def write_nodes(db: sqlite3.Connection, conversation_id: int,
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
        index_text(db, conversation_id, node.id, node.text)


def insert_conversation(db: sqlite3.Connection, tree: Tree, *, title: str,
                        created: float, updated: float, settings: dict[str, Any],
                        model: dict[str, Any] | None, pending: str | None = None) -> int:
    cursor = db.execute(
        "INSERT INTO conversations (title, created, updated, active_leaf, settings, model, "
        "pending) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (title, created, updated, tree.active_leaf, json.dumps(settings),
         json.dumps(model) if model is not None else None, pending),
    )
    return int(cursor.lastrowid or 0)


def insert_new_nodes(db: sqlite3.Connection, conversation_id: int,
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


def index_text(db: sqlite3.Connection, conversation_id: int, node_id: int,
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


def delete_nodes(db: sqlite3.Connection, conversation_id: int,
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
    _delete_rows(db, conversation_id, doomed)


def delete_conversation(db: sqlite3.Connection, conversation_id: int) -> None:
    doomed = [row[0] for row in db.execute(
        "SELECT id FROM nodes WHERE conversation_id = ?", (conversation_id,))]
    _delete_rows(db, conversation_id, doomed)
    db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))


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


def _pack_tokens(tokens: tuple[int, ...] | None) -> bytes | None:
    return None if tokens is None else array("i", tokens).tobytes()


def _unpack_tokens(blob: bytes | None) -> tuple[int, ...] | None:
    if blob is None:
        return None
    values = array("i")
    values.frombytes(blob)
    return tuple(values)


def node_from_row(row: tuple[Any, ...]) -> Node:
    node_id, parent, role, text, tokens, created, status, last_active, meta = row
    return Node(
        id=node_id, parent=parent, role=Role(role), text=text, created=created,
        tokens=_unpack_tokens(tokens), status=NodeStatus(status),
        last_active_child=last_active, meta=json.loads(meta),
    )


__all__ = [
    "delete_conversation",
    "delete_nodes",
    "index_text",
    "insert_conversation",
    "insert_new_nodes",
    "node_from_row",
    "write_nodes",
]
