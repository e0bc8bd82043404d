"""Moving through the tree panel's nodes with the keyboard, and what to say about each one.

Qt-free, like app.tree.tree_layout. The panel draws the root at the top and siblings left to right,
so the arrows follow the drawing: Up goes to the parent, Down to the child on the active
branch (else the first child), Left and Right to the previous and next sibling (the other
versions of that message), Home to the root and End to the active branch's last message.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from app.tree.tree_layout import PanelNode


class Step(Enum):
    PARENT = "parent"
    CHILD = "child"
    PREVIOUS_SIBLING = "previous sibling"
    NEXT_SIBLING = "next sibling"
    ROOT = "root"
    ACTIVE_LEAF = "active leaf"


_SPEAKERS = {"system": "System prompt", "user": "You", "assistant": "Assistant",
             "tool": "Tool result"}
_CHECKPOINTS = {"ram": "checkpoint in RAM", "disk": "checkpoint on disk"}


class TreeNavigation:
    """The panel's nodes indexed for stepping: parents, children and sibling order.

    Built from the same `PanelNode`s and active path the panel draws, in O(n).
    """

    def __init__(self, nodes: Sequence[PanelNode], active_path: Sequence[int]) -> None:
        self.nodes = {node.id: node for node in nodes}
        self.children: dict[int, list[int]] = {node.id: [] for node in nodes}
        self.roots: list[int] = []
        for node in nodes:
            if node.parent is not None and node.parent in self.children:
                self.children[node.parent].append(node.id)
            else:
                self.roots.append(node.id)
        self.active = [node_id for node_id in active_path if node_id in self.nodes]
        self._on_path = set(self.active)

    def siblings(self, node_id: int) -> list[int]:
        """The node and its siblings, left to right (the roots, for a root)."""
        parent = self.nodes[node_id].parent
        return self.roots if parent is None else self.children.get(parent, self.roots)

    def start(self) -> int | None:
        """Where the keyboard starts: the active branch's last node, else the first root."""
        if self.active:
            return self.active[-1]
        return self.roots[0] if self.roots else None

    def step(self, node_id: int, step: Step) -> int:
        """The node one `step` from `node_id` (itself when there is none that way)."""
        node = self.nodes[node_id]
        if step is Step.PARENT:
            return node.parent if node.parent in self.nodes else node_id
        if step is Step.CHILD:
            kids = self.children[node_id]
            on_path = [kid for kid in kids if kid in self._on_path]
            return (on_path or kids or [node_id])[0]
        if step in (Step.PREVIOUS_SIBLING, Step.NEXT_SIBLING):
            row = self.siblings(node_id)
            at = row.index(node_id) + (1 if step is Step.NEXT_SIBLING else -1)
            return row[at] if 0 <= at < len(row) else node_id
        if step is Step.ROOT:
            return self.roots[0] if self.roots else node_id
        return self.active[-1] if self.active else node_id

    def describe(self, node_id: int) -> str:
        """What a screen reader says for a node: who, which version, where, its text."""
        node = self.nodes[node_id]
        parts = [_SPEAKERS.get(node.role, node.role)]
        row = self.siblings(node_id)
        if len(row) > 1 and node.parent is not None:
            parts.append(f"version {row.index(node_id) + 1} of {len(row)}")
        if node_id in self._on_path:
            parts.append("on the shown branch")
        if node.checkpoint in _CHECKPOINTS:
            parts.append(_CHECKPOINTS[node.checkpoint])
        branches = len(self.children[node_id])
        if branches > 1:
            parts.append(f"{branches} branches from here")
        return f"{', '.join(parts)}: {node.label}"
