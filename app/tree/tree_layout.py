"""What the tree panel draws, and where: `PanelNode` values and their tidy top-down layout.

Qt-free: `panel_nodes_from_tree` turns an `engine.core.tree.Tree` into `PanelNode`s, `layout_tree`
places them in O(n) and `validate_nodes` rejects input the panel cannot draw.
`app.tree.tree_panel` draws the result.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from engine.core.tree import Role, Tree

log = logging.getLogger(__name__)

ROLES = frozenset(role.value for role in Role)
CHECKPOINT_KINDS = frozenset({"ram", "disk"})

NODE_RADIUS = 7.0  # a 14 px circle at zoom 1
COLUMN_WIDTH = 24.0  # horizontal distance between two leaf columns
ROW_HEIGHT = 40.0  # vertical distance between two depths
FOREST_GAP = 1.0  # extra empty columns between separate roots (only for malformed input)
MARGIN = 24.0

LABEL_CHARS = 40


@dataclass(frozen=True)
class PanelNode:
    """What the panel needs to know about one message."""

    id: int
    parent: int | None
    role: str  # "system" | "user" | "assistant"
    label: str  # a short one-line preview of the text
    checkpoint: str | None = None  # None, "ram" or "disk"


def preview(text: str, limit: int = LABEL_CHARS) -> str:
    """The text on one line (whitespace runs collapsed), cut to `limit` characters with '…'."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    return line[: limit - 1].rstrip() + "…"


def panel_nodes_from_tree(
    tree: Tree, checkpoints: Mapping[int, str] | None = None
) -> list[PanelNode]:
    """The tree's nodes as `PanelNode`s, parents before children, siblings in tree order.

    `checkpoints` maps a node id to "ram" or "disk" for the nodes that hold a checkpoint; ids
    that are not in the tree are ignored.
    """
    checkpoints = checkpoints or {}
    for node_id, kind in checkpoints.items():
        if kind not in CHECKPOINT_KINDS:
            raise ValueError(f"node {node_id}: unknown checkpoint kind {kind!r}")
    out: list[PanelNode] = []
    for node_id in tree.subtree(tree.root_id):  # pre-order: children in their tree order
        node = tree.node(node_id)
        label = preview(node.text)
        if node.parent is None and not label:
            label = "System prompt"
        out.append(
            PanelNode(
                id=node.id,
                parent=node.parent,
                role=Role(node.role).value,
                label=label,
                checkpoint=checkpoints.get(node.id),
            )
        )
    return out


def validate_nodes(nodes: Iterable[PanelNode]) -> None:
    """Reject input the panel cannot draw, before the old drawing is dropped."""
    seen: set[int] = set()
    for node in nodes:
        if node.id in seen:
            raise ValueError(f"node {node.id} is listed twice")
        seen.add(node.id)
        if node.role not in ROLES:
            raise ValueError(f"node {node.id}: unknown role {node.role!r}")
        if node.checkpoint is not None and node.checkpoint not in CHECKPOINT_KINDS:
            raise ValueError(f"node {node.id}: unknown checkpoint kind {node.checkpoint!r}")


@dataclass(frozen=True)
class TreeLayout:
    """Node centres in scene coordinates and the size of the drawing."""

    centres: dict[int, tuple[float, float]]
    width: float
    height: float


def layout_tree(nodes: Sequence[PanelNode]) -> TreeLayout:
    """A tidy top-down layout in O(n).

    Every leaf gets a column of its own, in depth-first order (children left to right in the
    order they appear in `nodes`); a parent is centred over its first and last child; depth is
    the row. Within a row, subtrees own disjoint column ranges, so two nodes of one row are at
    least one column apart. A node whose parent is missing is laid out as an extra root; nodes
    that no root reaches (a cycle) are left out and logged.
    """
    ids = {node.id for node in nodes}
    children: dict[int, list[int]] = {node.id: [] for node in nodes}
    roots: list[int] = []
    for node in nodes:
        if node.parent is None or node.parent not in ids:
            if node.parent is not None:
                log.warning("tree panel: node %d has a missing parent %d", node.id, node.parent)
            roots.append(node.id)
        else:
            children[node.parent].append(node.id)

    column: dict[int, float] = {}
    depth: dict[int, int] = {}
    next_column = 0.0
    max_depth = 0
    for index, root in enumerate(roots):
        if index:
            next_column += FOREST_GAP
        # Iterative post-order walk (a long chat is a deep chain; recursion would overflow).
        stack: list[tuple[int, int, bool]] = [(root, 0, False)]
        while stack:
            node_id, level, expanded = stack.pop()
            kids = children[node_id]
            if not expanded:
                depth[node_id] = level
                max_depth = max(max_depth, level)
                stack.append((node_id, level, True))
                stack.extend((kid, level + 1, False) for kid in reversed(kids))
            elif kids:
                column[node_id] = (column[kids[0]] + column[kids[-1]]) / 2
            else:
                column[node_id] = next_column
                next_column += 1
    if len(column) != len(children):
        log.warning(
            "tree panel: %d nodes are not reachable from a root and are not drawn",
            len(children) - len(column),
        )
    centres = {
        node_id: (MARGIN + NODE_RADIUS + col * COLUMN_WIDTH,
                  MARGIN + NODE_RADIUS + depth[node_id] * ROW_HEIGHT)
        for node_id, col in column.items()
    }
    columns = max(next_column - 1, 0.0)
    width = 2 * (MARGIN + NODE_RADIUS) + columns * COLUMN_WIDTH
    height = 2 * (MARGIN + NODE_RADIUS) + max_depth * ROW_HEIGHT
    return TreeLayout(centres, width, height)
