"""How API requests become paths in conversation trees.

A client sends the whole message list every time. Arbor keeps one tree per (model, system
prompt, first user message): the request is walked down that tree node by node, matching each
message by role and exact text, and whatever does not match is added as a new branch. So:

- the next turn extends the branch (its messages all match, one user message is new);
- a repeated request (a "swipe", a regenerate) matches every message and gets a new reply
  beside the earlier ones;
- an edit of an earlier message matches up to it, then starts a new branch there;
- a return to an earlier branch matches that branch again.

The prefix of every path is the same nodes with the same per-node tokens as before, so the
engine's checkpoints (keyed on tokens) serve API requests exactly as they serve the window.
The trees are ordinary conversations in the store ("API: <first message>" in the sidebar).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from engine.api.schema import Message
from engine.conversation import Change, Conversation, ReplyJob
from engine.store import Store
from engine.tree import Node, NodeStatus, Tree

TITLE_CHARS = 60


def tree_key(model: str, system: str, first: str) -> str:
    """The name under which a request's tree is kept (in the conversation's settings)."""
    digest = hashlib.sha256()
    for part in (model, system, first):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass
class ApiTree:
    """One API conversation; `id` is None until its first reply is saved (a request that
    is refused or fails leaves no conversation behind)."""

    key: str
    title: str
    conversation: Conversation
    id: int | None = None


@dataclass(frozen=True)
class Placed:
    """A request placed in its tree: the conversation, what to save, the reply to run."""

    tree: ApiTree
    change: Change  # new nodes (the branch the request added), the reply job


class ApiTrees:
    """The API's conversations, found or made on demand (one thread uses it: the worker's)."""

    def __init__(self, store: Store, model: str) -> None:
        self.store = store
        self.model = model  # the model file's identity: node tokens depend on its tokenizer
        self._open: dict[str, ApiTree] = {}

    def place(self, system: str, messages: Sequence[Message]) -> Placed:
        held = self._tree(system, messages[0].text)
        tree = held.conversation.tree
        added: list[Node] = []
        node = tree.root
        for message in messages:
            match = _child(tree, node, message)
            if match is None:
                match = tree.add_child(node.id, message.role, message.text)
                added.append(match)
            node = match
        tree.set_active(node.id)
        return Placed(held, Change(nodes=tuple(added), reply=ReplyJob(node.id)))

    def save(self, held: ApiTree, nodes: Sequence[Node], deleted: Sequence[int] = ()) -> None:
        """Write a change; the first one creates the conversation, whole."""
        if held.id is None:
            held.id = self.store.create(held.conversation.tree, title=held.title,
                                        settings={"api_tree": held.key})
        else:
            self.store.save(held.id, held.conversation.tree, nodes, deleted=deleted)

    def forget(self, held: ApiTree) -> None:
        """Drop a cached tree (after a failed save: the next request reads the store)."""
        self._open.pop(held.key, None)

    def _tree(self, system: str, first: str) -> ApiTree:
        key = tree_key(self.model, system, first)
        held = self._open.get(key)
        if held is not None and (held.id is None or self.store.exists(held.id)):
            return held
        title = "API: " + (" ".join(first.split())[:TITLE_CHARS] or "(empty)")
        found = self.store.find_api_tree(key)
        tree = self.store.load(found) if found is not None else Tree(system)
        held = ApiTree(key, title, Conversation(tree), found)
        self._open[key] = held
        return held


def _child(tree: Tree, parent: Node, message: Message) -> Node | None:
    """The child of `parent` that is this message: same role and text; the last-active one
    first, then the newest. A reply that was cut short matches only if the client sends its
    text as it stands."""
    candidates = [tree.node(c) for c in parent.children]
    matching = [n for n in candidates if n.role is message.role and n.text == message.text
                and n.status is not NodeStatus.STREAMING]
    if not matching:
        return None
    for node in matching:
        if node.id == parent.last_active_child:
            return node
    return matching[-1]

