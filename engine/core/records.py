"""Plain records of a whole conversation tree, for files and for moving trees between stores.

A `ConversationRecord` is what every file format reads and writes: every node of every branch
with its parent, role, text, tokens and status, plus the active leaf. `validate()` checks the
shape before anything is built from a record (one system root, existing parents, no cycles,
bounded depth and size, known roles), and `to_tree()` builds a `Tree` with fresh ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.errors import ArborError
from engine.core.tree import Node, NodeStatus, Role, Tree

MAX_NODES = 200_000
MAX_DEPTH = 20_000
MAX_TEXT = 4 << 20  # characters per message
MAX_TOKENS_PER_NODE = 1 << 20


class RecordError(ArborError):
    """A conversation in a file is malformed; the message names the problem."""


@dataclass(frozen=True)
class NodeRecord:
    id: str  # unique within the record; never trusted as a store id
    parent: str | None
    role: Role
    text: str
    created: float
    tokens: tuple[int, ...] | None = None
    status: NodeStatus = NodeStatus.COMPLETE
    meta: dict[str, Any] = field(default_factory=dict)
    last_active_child: str | None = None  # which child the branch continues with


@dataclass(frozen=True)
class ConversationRecord:
    title: str
    nodes: tuple[NodeRecord, ...]  # the root (role system, parent None) among them
    active_leaf: str
    created: float = 0.0
    updated: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] | None = None

    @property
    def root(self) -> NodeRecord:
        return next(n for n in self.nodes if n.parent is None)


def validate(record: ConversationRecord) -> None:
    """Raise RecordError unless the record is one well-formed tree."""
    title = f"conversation {record.title!r}"
    if not record.nodes:
        raise RecordError(f"{title} has no messages")
    if len(record.nodes) > MAX_NODES:
        raise RecordError(f"{title} has {len(record.nodes)} messages (the limit is {MAX_NODES})")
    by_id: dict[str, NodeRecord] = {}
    for node in record.nodes:
        if node.id in by_id:
            raise RecordError(f"{title}: message id {node.id!r} appears twice")
        by_id[node.id] = node
        if not isinstance(node.role, Role):
            raise RecordError(f"{title}: message {node.id!r} has an unknown role")
        if len(node.text) > MAX_TEXT:
            raise RecordError(f"{title}: message {node.id!r} is longer than {MAX_TEXT} characters")
        if node.tokens is not None and len(node.tokens) > MAX_TOKENS_PER_NODE:
            raise RecordError(f"{title}: message {node.id!r} has too many tokens")
    roots = [n for n in record.nodes if n.parent is None]
    if len(roots) != 1:
        raise RecordError(f"{title} has {len(roots)} roots; a conversation has exactly one")
    if roots[0].role is not Role.SYSTEM:
        raise RecordError(f"{title}: the root must be the system prompt")
    for node in record.nodes:
        if node.parent is not None and node.parent not in by_id:
            raise RecordError(f"{title}: message {node.id!r} has a missing parent")
        if node.parent is not None and node.role is Role.SYSTEM:
            raise RecordError(f"{title}: message {node.id!r} is a system message below the root")
    # Every node must reach the root within MAX_DEPTH steps: catches cycles and absurd depth.
    depth: dict[str, int] = {roots[0].id: 0}
    for node in record.nodes:
        chain: list[str] = []
        current: str | None = node.id
        while current is not None and current not in depth:
            chain.append(current)
            if len(chain) > MAX_DEPTH:
                raise RecordError(f"{title} is deeper than {MAX_DEPTH} messages or has a cycle")
            current = by_id[current].parent
            if current in chain:
                raise RecordError(f"{title}: messages form a cycle")
        if current is None:
            raise RecordError(f"{title}: messages form a cycle")
        base = depth[current]
        for offset, node_id in enumerate(reversed(chain), start=1):
            depth[node_id] = base + offset
            if depth[node_id] > MAX_DEPTH:
                raise RecordError(f"{title} is deeper than {MAX_DEPTH} messages")
    if record.active_leaf not in by_id:
        raise RecordError(f"{title}: the active message does not exist")


def from_tree(
    tree: Tree,
    *,
    title: str,
    created: float | None = None,
    settings: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
) -> ConversationRecord:
    """A record of every node of `tree` (ids become strings; order: parents first)."""
    nodes = tuple(
        NodeRecord(
            id=str(node.id),
            parent=str(node.parent) if node.parent is not None else None,
            role=node.role,
            text=node.text,
            created=node.created,
            tokens=node.tokens,
            status=node.status,
            meta=dict(node.meta),
            last_active_child=(
                str(node.last_active_child) if node.last_active_child is not None else None
            ),
        )
        for node in (tree.node(i) for i in tree.subtree(tree.root_id))
    )
    stamps = [n.created for n in nodes]
    return ConversationRecord(
        title=title,
        nodes=nodes,
        active_leaf=str(tree.active_leaf),
        created=created if created is not None else min(stamps),
        updated=max(stamps),
        settings=dict(settings or {}),
        model=model,
    )


def to_tree(record: ConversationRecord) -> Tree:
    """Build a Tree from a validated record. Ids are remapped (parents before children);
    sibling order follows creation time, then file order; the active path is the record's
    active leaf. Linear in the number of nodes (imports hold tens of thousands)."""
    validate(record)
    children: dict[str, list[NodeRecord]] = {}
    for node in record.nodes:
        if node.parent is not None:
            children.setdefault(node.parent, []).append(node)
    order = {node.id: i for i, node in enumerate(record.nodes)}
    root = record.root
    mapping = {root.id: 0}
    built = [Node(id=0, parent=None, role=Role.SYSTEM, text=root.text, created=root.created,
                  tokens=root.tokens, meta=dict(root.meta))]  # the tools offered, if any
    stack = [root]
    while stack:
        parent = stack.pop()
        kids = sorted(children.get(parent.id, []), key=lambda n: (n.created, order[n.id]))
        for kid in kids:
            mapping[kid.id] = len(built)
            built.append(Node(id=len(built), parent=mapping[parent.id], role=kid.role,
                              text=kid.text, created=kid.created, tokens=kid.tokens,
                              status=kid.status, meta=dict(kid.meta)))
        stack.extend(reversed(kids))
    parents = {node.id: node.parent for node in record.nodes}
    for node in record.nodes:
        child = node.last_active_child
        if child is not None and child in mapping and parents.get(child) == node.id:
            built[mapping[node.id]].last_active_child = mapping[child]
    tree = Tree.from_nodes(built, active_leaf=mapping[record.active_leaf])
    for kept in tree.nodes():
        if kept.children and kept.last_active_child is None:
            kept.last_active_child = kept.children[-1]  # the newest, as when it was written
    return tree


__all__ = [
    "ConversationRecord",
    "NodeRecord",
    "RecordError",
    "from_tree",
    "to_tree",
    "validate",
]
