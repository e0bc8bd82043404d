"""How API requests become paths in conversation trees.

A client sends the whole message list every time. Arbor keeps one tree per (cache scope,
model, system prompt, first user message), so clients of different scopes (`user` values)
never share a tree or its nodes' tokens: the request is walked down that tree node by node,
matching each message by role and exact text, and whatever does not match is added as a new
branch. So:

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
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.api.schema import ChatRequest, Message
from engine.api.worker import Begun
from engine.core.attachments import DOCUMENTS, documents_of
from engine.core.conversation import Conversation, ReplyJob
from engine.core.errors import ArborError
from engine.core.reasoning import OPENED, is_opened
from engine.core.results import FinishReason, NodeView, Outcome, ReplyResult
from engine.core.tools import TOOL_CALL_ID, TOOL_CALLS, TOOLS, calls_of
from engine.core.tree import Node, NodeStatus, Tree
from engine.service.lifetime import ReplyRun
from engine.storage.store import Store

log = logging.getLogger(__name__)

TITLE_CHARS = 60


def tree_key(model: str, system: str, first: str, scope: str, tools: str = "") -> str:
    """The name under which a request's tree is kept (in the conversation's settings). The
    tools offered are part of the prompt (the template renders them first), so a request
    offering others is another conversation."""
    digest = hashlib.sha256()
    for part in (scope, model, system, first, *((tools,) if tools else ())):
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
    """A request placed in its tree: the conversation, the branch it added, its reply."""

    tree: ApiTree
    added: tuple[Node, ...]
    run: ReplyRun  # the reply's lifetime
    created: bool  # its conversation was made for this request


class ApiTrees:
    """The API's conversations, found or made on demand, on one thread (`TreeSide`).

    `opened` gives the conversation object a window already holds for an id (the app: one
    tree in memory per conversation, whoever changes it); `saved` is told of every write."""

    def __init__(self, store: Store, *,
                 opened: Callable[[int], Conversation | None] = lambda _id: None,
                 saved: Callable[[int], None] = lambda _id: None,
                 save_streaming: bool = True) -> None:
        """`save_streaming`: write a request's messages and its reply, streaming, before
        the reply runs (the app: the window shows it answering, and the app's next start
        settles it if the app dies); else only with the finished reply."""
        self.store = store
        self._opened = opened
        self._saved = saved
        self._save_streaming = save_streaming
        self._open: dict[str, ApiTree] = {}

    def begin(self, request: ChatRequest, model: str, base_seed: int | None) -> Begun:
        held = self._tree(model, request.system, request.messages[0].text, request.scope,
                          request.tools)
        conversation = held.conversation
        tree = conversation.tree
        added: list[Node] = []
        node = tree.root
        for index, message in enumerate(request.messages):
            # A prefill is a reply of its own, as a swipe is: never one it happens to match.
            prefill = request.prefill and index == len(request.messages) - 1
            match = None if prefill else _child(tree, node, message)
            if match is None:
                match = tree.add_child(node.id, message.role, message.text)
                if message.tool_calls:
                    match.meta[TOOL_CALLS] = [call.to_meta() for call in message.tool_calls]
                if message.tool_call_id is not None:
                    match.meta[TOOL_CALL_ID] = message.tool_call_id
                if message.documents:
                    match.meta[DOCUMENTS] = [d.to_meta() for d in message.documents]
                added.append(match)
            node = match
        created = held.id is None
        job = ReplyJob(node.parent, resume=node.id) if request.prefill and node.parent is not \
            None else ReplyJob(node.id)

        def keep(nodes: Sequence[Node], deleted: Sequence[int]) -> None:
            # Kept as it goes when streaming replies are (the app: a new tree too, so that its
            # id names its nodes' checkpoints in the engine); else once answered (`finish`).
            if self._save_streaming:
                self._save(held, nodes, deleted)

        try:
            run = ReplyRun.begin(conversation, job, keep, with_nodes=added)
        except ArborError:  # the memory keeps what the store has, no more
            for new in added:
                if new.id in tree:
                    tree.delete_branch(new.id)
            raise
        run.conversation_id = held.id or 0
        placed = Placed(held, tuple(added), run, created)
        seed = conversation.reply_seed(base_seed)
        resume = run.start.resume
        return Begun(placed, tuple(NodeView.of(n).to_node() for n in run.start.path), seed,
                     run.conversation_id,
                     NodeView.of(resume).to_node() if resume is not None else None)

    def finish(self, begun: Begun, outcome: Outcome, streamed: str, cut: str | None
               ) -> list[Node]:
        placed = _placed(begun)
        run, held = placed.run, placed.tree
        if not isinstance(outcome, ReplyResult) and streamed:
            run.piece(streamed)  # what the client was sent (its pieces come in at the end)
        if begun.resume is not None and not isinstance(outcome, ReplyResult) and not streamed:
            self._take_back(placed)  # a prefill that said nothing: as if never asked
            return []
        try:
            change = run.finish(outcome, amend=_cut if cut is not None else None)
            if run.taken_back:  # it said nothing: the request leaves its tree as it was
                self._take_back(placed)
                return []
            if not self._save_streaming:
                self._save(held, [*placed.added, *change.nodes], change.deleted)
        except ArborError:  # the request is taken back whole, in memory and in the store
            self._take_back(placed)
            raise
        return held.conversation.warm_path() if isinstance(outcome, ReplyResult) else []

    def _take_back(self, placed: Placed) -> None:
        gone = _delete(placed.tree.conversation.tree, placed)
        if placed.tree.id is None:
            self._open.pop(placed.tree.key, None)
            return
        if not self._save_streaming:
            return  # nothing of this request reached the store
        if placed.created:  # made for this request: it goes whole
            self._open.pop(placed.tree.key, None)
            self.store.discard(placed.tree.id)
            self._saved(placed.tree.id)
            return
        try:
            self._save(placed.tree, (), gone)
        except ArborError as exc:
            log.error("could not take back a failed request: %s", exc)
            self._open.pop(placed.tree.key, None)  # read again from the store next time

    def close(self) -> None:
        pass

    def _save(self, held: ApiTree, nodes: Sequence[Node], deleted: Sequence[int] = ()) -> None:
        if held.id is None:
            held.id = self.store.create(held.conversation.tree, title=held.title,
                                        settings={"api_tree": held.key})
        else:
            self.store.save(held.id, held.conversation.tree, nodes, deleted=deleted)
        self._saved(held.id)

    def _tree(self, model: str, system: str, first: str, scope: str, tools: str) -> ApiTree:
        key = tree_key(model, system, first, scope, tools)
        held = self._open.get(key)
        if held is not None and (held.id is None or self.store.exists(held.id)):
            if held.id is not None and (shared := self._opened(held.id)) is not None:
                held.conversation = shared
            return held
        title = "API: " + (" ".join(first.split())[:TITLE_CHARS] or "(empty)")
        found = self.store.find_api_tree(key)
        conversation = self._opened(found) if found is not None else None
        if conversation is None:
            if found is not None:
                conversation = Conversation(self.store.load(found))
            else:
                tree = Tree(system)
                if tools:
                    tree.root.meta[TOOLS] = json.loads(tools)
                conversation = Conversation(tree)
        held = ApiTree(key, title, conversation, found)
        self._open[key] = held
        return held


class LocalTrees(ApiTrees):
    """`arbor-engine serve`'s tree side: its own store connection."""

    def __init__(self, db: Path | None) -> None:
        # The app may have the database open and be streaming: no recovery from here, and
        # so no streaming reply written either (a serve that is killed leaves none behind).
        super().__init__(Store(db, recover=False), save_streaming=False)

    def close(self) -> None:
        self.store.close()


def _same_tools(node: Node, message: Message) -> bool:
    """The node makes the message's calls (ids aside: a client may number them its own way)
    or answers the same call."""
    calls = calls_of(node.meta)
    if len(calls) != len(message.tool_calls) or not all(
            mine.same_call(theirs) for mine, theirs in zip(calls, message.tool_calls, strict=True)):
        return False
    return node.meta.get(TOOL_CALL_ID) == message.tool_call_id


def _cut(reply: Node) -> None:
    """A reply cut at a stop sequence: its tokens went past the cut, so it is rendered again
    from its text."""
    reply.tokens, reply.meta = None, {"finish": FinishReason.STOP.value,
                                      OPENED: is_opened(reply.meta)}
    reply.status = NodeStatus.COMPLETE


def _delete(tree: Tree, placed: Placed) -> list[int]:
    """Take a request's reply and the messages it added out of `tree`; the ids gone."""
    gone: list[int] = []
    for node_id in (placed.run.reply.id, *(n.id for n in placed.added)):
        if node_id in tree:
            gone += tree.delete_branch(node_id)
    return gone


def _placed(begun: Begun) -> Placed:
    assert isinstance(begun.token, Placed)
    return begun.token


def _child(tree: Tree, parent: Node, message: Message) -> Node | None:
    """The child of `parent` that is this message: same role and text; the last-active one
    first, then the newest. A reply that was cut short matches only if the client sends its
    text as it stands."""
    candidates = [tree.node(c) for c in parent.children]
    matching = [n for n in candidates if n.role is message.role and n.text == message.text
                and n.status is not NodeStatus.STREAMING and _same_tools(n, message)
                and documents_of(n.meta) == message.documents]
    if not matching:
        return None
    if message.tool_calls:  # the reply that made these very calls, when there is one
        ids = [call.id for call in message.tool_calls]
        matching = [n for n in matching if [c.id for c in calls_of(n.meta)] == ids] or matching
    for node in matching:
        if node.id == parent.last_active_child:
            return node
    return matching[-1]

