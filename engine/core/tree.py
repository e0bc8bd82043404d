"""The conversation tree as plain data.

A conversation is a tree whose root is the system node. Every other node is a user or an
assistant message. Editing never overwrites: it adds a sibling. Each node remembers its
last-active child, so switching to a sibling and following last-active children always
yields one well-defined active path, ending at the active leaf.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"  # a tool's result, answering a call of the reply before it (engine.core.tools)


class NodeStatus(StrEnum):
    """How complete a node's text is. Only assistant replies are ever not COMPLETE."""

    COMPLETE = "complete"
    STREAMING = "streaming"
    INTERRUPTED = "interrupted"


class TreeError(ValueError):
    """An operation that the tree's shape does not allow (a bad index, deleting the root...)."""


@dataclass
class Node:
    id: int
    parent: int | None
    role: Role
    text: str
    created: float
    # The exact tokens this node contributed the first time it was processed: its slice of
    # the rendered chat template. None until the node is first part of a prompt.
    tokens: tuple[int, ...] | None = None
    children: list[int] = field(default_factory=list)
    last_active_child: int | None = None
    status: NodeStatus = NodeStatus.COMPLETE
    meta: dict[str, object] = field(default_factory=dict)


class Tree:
    """One conversation. Node ids are unique within the tree and never reused."""

    def __init__(self, system: str = "") -> None:
        self._nodes: dict[int, Node] = {}
        self._next_id = 0
        root = self._new_node(None, Role.SYSTEM, system)
        self.root_id = root.id
        self.active_leaf = root.id

    @classmethod
    def from_nodes(cls, nodes: list[Node], *, active_leaf: int | None) -> Tree:
        """Rebuild a tree from stored nodes (parents, children order by id, pointers)."""
        tree = cls.__new__(cls)
        tree._nodes = {}
        roots = [n for n in nodes if n.parent is None]
        if len(roots) != 1:
            raise TreeError(f"a stored conversation has {len(roots)} roots")
        for node in sorted(nodes, key=lambda n: n.id):
            node.children = []
            tree._nodes[node.id] = node
        for node in sorted(nodes, key=lambda n: n.id):
            if node.parent is not None:
                if node.parent not in tree._nodes:
                    raise TreeError(f"stored message {node.id} has a missing parent")
                tree._nodes[node.parent].children.append(node.id)
        for node in tree._nodes.values():
            if node.last_active_child not in (None, *node.children):
                node.last_active_child = node.children[-1] if node.children else None
        tree.root_id = roots[0].id
        tree._next_id = max(tree._nodes) + 1
        leaf = active_leaf if active_leaf in tree._nodes else tree.root_id
        tree.active_leaf = tree.root_id
        tree.set_active(leaf)
        return tree

    # --- reading -----------------------------------------------------------------------

    def node(self, node_id: int) -> Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise TreeError(f"there is no node {node_id}") from None

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def nodes(self) -> Iterator[Node]:
        return iter(self._nodes.values())

    @property
    def root(self) -> Node:
        return self._nodes[self.root_id]

    def path_to(self, node_id: int) -> list[Node]:
        """The nodes from the root to `node_id`, both included."""
        path: list[Node] = []
        current: int | None = node_id
        while current is not None:
            node = self.node(current)
            path.append(node)
            current = node.parent
        path.reverse()
        return path

    def active_path(self) -> list[Node]:
        return self.path_to(self.active_leaf)

    def messages(self) -> list[Node]:
        """The active path without the system root: what the user sees, in order."""
        return self.active_path()[1:]

    def message(self, index: int) -> Node:
        """The `index`-th message (0-based, system excluded) of the active path."""
        messages = self.messages()
        if not 0 <= index < len(messages):
            raise TreeError(
                f"message {index} does not exist (the active path has {len(messages)} messages)"
            )
        return messages[index]

    def siblings(self, node_id: int) -> list[int]:
        """All children of the node's parent in creation order (the node itself included)."""
        node = self.node(node_id)
        if node.parent is None:
            return [node.id]
        return list(self.node(node.parent).children)

    def subtree(self, node_id: int) -> list[int]:
        """The node and all its descendants, parents before children."""
        out: list[int] = []
        stack = [node_id]
        while stack:
            current = stack.pop()
            out.append(current)
            stack.extend(reversed(self.node(current).children))
        return out

    def follow_last_active(self, node_id: int) -> int:
        """Descend from `node_id` through last-active children to a leaf of that branch."""
        current = self.node(node_id)
        while current.last_active_child is not None:
            current = self.node(current.last_active_child)
        return current.id

    # --- changing ----------------------------------------------------------------------

    def add_child(
        self,
        parent_id: int,
        role: Role,
        text: str,
        *,
        status: NodeStatus = NodeStatus.COMPLETE,
    ) -> Node:
        """Append a new child and make it the active leaf."""
        if role is Role.SYSTEM:
            raise TreeError("only the root can be a system node")
        self.node(parent_id)  # raises for an unknown parent
        node = self._new_node(parent_id, role, text, status=status)
        self._nodes[parent_id].children.append(node.id)
        self.set_active(node.id)
        return node

    def add_sibling(self, node_id: int, text: str) -> Node:
        """A new version of a message: same parent and role, the old one is kept."""
        node = self.node(node_id)
        if node.parent is None:
            raise TreeError("the system prompt has no siblings; set it on the root instead")
        return self.add_child(node.parent, node.role, text)

    def set_active(self, node_id: int) -> None:
        """Make `node_id` the active leaf and record the path to it as last-active."""
        path = self.path_to(node_id)
        for parent, child in itertools.pairwise(path):
            parent.last_active_child = child.id
        self.active_leaf = node_id

    def switch_variant(self, node_id: int, variant: int) -> int:
        """Activate the `variant`-th sibling of `node_id` and follow its branch to its leaf."""
        siblings = self.siblings(node_id)
        if not 0 <= variant < len(siblings):
            raise TreeError(
                f"variant {variant} does not exist (the message has {len(siblings)} versions)"
            )
        leaf = self.follow_last_active(siblings[variant])
        self.set_active(leaf)
        return leaf

    def rewind(self, node_id: int) -> None:
        """Make `node_id` the active leaf; its descendants are kept and stay reachable."""
        self.set_active(node_id)

    def delete_branch(self, node_id: int) -> list[int]:
        """Remove a node and its subtree. Returns the removed ids.

        If the active path ran through the removed node, the active path moves to the
        nearest remaining sibling's branch, or to the parent when there is none.
        """
        node = self.node(node_id)
        if node.parent is None:
            raise TreeError("the system prompt cannot be deleted")
        parent = self.node(node.parent)
        on_active_path = any(n.id == node_id for n in self.active_path())
        removed = self.subtree(node_id)
        index = parent.children.index(node_id)
        parent.children.remove(node_id)
        for gone in removed:
            del self._nodes[gone]
        if parent.last_active_child == node_id:
            parent.last_active_child = None
            if parent.children:
                # The sibling that sat before it, or the first one: like closing a tab.
                parent.last_active_child = parent.children[max(0, index - 1)]
        if on_active_path:
            self.set_active(self.follow_last_active(parent.id))
        return removed

    def reinsert(self, nodes: list[Node], position: int, *, active_leaf: int) -> None:
        """Undo of `delete_branch`: put removed nodes back (same ids, same place)."""
        top = nodes[0]
        if top.parent is None or top.parent not in self._nodes:
            raise TreeError("the branch's parent no longer exists")
        for node in nodes:
            if node.id in self._nodes:
                raise TreeError(f"node {node.id} exists already")
        for node in nodes:
            self._nodes[node.id] = node
        siblings = self._nodes[top.parent].children
        siblings.insert(min(position, len(siblings)), top.id)
        self._next_id = max(self._next_id, *(n.id + 1 for n in nodes))
        self.set_active(active_leaf if active_leaf in self._nodes else top.id)

    def _new_node(
        self,
        parent: int | None,
        role: Role,
        text: str,
        *,
        status: NodeStatus = NodeStatus.COMPLETE,
    ) -> Node:
        node = Node(
            id=self._next_id,
            parent=parent,
            role=role,
            text=text,
            created=time.time(),
            status=status,
        )
        self._next_id += 1
        self._nodes[node.id] = node
        return node
