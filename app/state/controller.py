"""The window's state without widgets: the open conversations, the current one, undo, and
every operation a user applies, each one a call into the conversation core
(`engine.core.conversation`) plus one transaction in the store.

The controller decides nothing about trees or seeds itself: it calls the core, persists the
`Change` it returns, and hands reply jobs to `Replies` (the engine side). A store error at any
point is one `error` message and leaves the state as it was; what the views show is always
what is saved. Views listen to the signals and read the state back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from PySide6.QtCore import QObject, Signal

from app.state.engine_client import QtEngine
from app.state.replies import Replies
from app.state.tool_calls import ToolCalls
from engine.config.mcp import McpServer
from engine.config.overrides import Overrides
from engine.config.settings import Settings
from engine.core.attachments import Document
from engine.core.conversation import Change, Conversation
from engine.core.errors import ArborError
from engine.core.titles import NEW_TITLE, title_from
from engine.core.tools import ToolCall
from engine.core.tree import Node, Role, Tree, TreeError
from engine.mcp.hub import McpHub
from engine.service.protocol import ForgetRequest
from engine.storage.store import ConversationInfo, SearchHit, Store

log = logging.getLogger(__name__)
T = TypeVar("T")


class ChatController(QObject):
    changed = Signal()  # the current conversation (or which one is current) changed
    listed = Signal()  # the list of conversations changed (titles, order, new, deleted)
    focus_node = Signal(int)  # the views should show this node of the current conversation
    notice = Signal(str, int)  # a passing status message and how long to show it (ms)
    error = Signal(str)  # something failed: one message for the user
    # The current conversation was set to a model other than the one loaded: its path.
    model_wanted = Signal(str)

    def __init__(self, store: Store, settings: Settings, engine: QtEngine,
                 parent: QObject | None = None, *,
                 mcp_hub: Callable[[list[McpServer]], McpHub] | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self.conversations: dict[int, Conversation] = {}  # the open ones, by id
        self.current: int | None = None
        self._undo: list[tuple[str, Callable[[], None]]] = []
        self.replies = Replies(self, engine)
        self.tools = ToolCalls(self, mcp_hub)  # `mcp_hub`: makes the hub (tests pass their own)
        self.replies.reply_kept.connect(self.tools.reply_done)

    # --- state -------------------------------------------------------------------------------

    @property
    def conversation(self) -> Conversation:
        assert self.current is not None
        return self.conversations[self.current]

    @property
    def tree(self) -> Tree:
        return self.conversation.tree

    def tree_of(self, conversation_id: int) -> Tree | None:
        """The tree of an open conversation, if it is open."""
        conversation = self.conversations.get(conversation_id)
        return conversation.tree if conversation is not None else None

    def listing(self, query: str = "") -> tuple[list[ConversationInfo], list[SearchHit] | None]:
        """The conversations, newest first, and the search hits for `query` (None: no
        search). Empty if the store cannot be read (the user is told)."""
        hits = self.fetch(lambda: self.store.search(query)) if query.strip() else None
        return self.fetch(self.store.list) or [], hits

    @property
    def can_undo(self) -> bool:
        return bool(self._undo)

    # --- conversations -----------------------------------------------------------------------

    def new_conversation(self) -> bool:
        tree = Tree()
        cid = self.fetch(lambda: self.store.create(tree, title=NEW_TITLE))
        if cid is None:
            return False
        self.conversations[cid] = Conversation(tree)
        self.current = cid
        self.listed.emit()
        self.changed.emit()
        return True

    def open_conversation(self, conversation_id: int) -> bool:
        if conversation_id not in self.conversations:
            tree = self.fetch(lambda: self.store.load(conversation_id))
            if tree is None:
                return False
            self.conversations[conversation_id] = Conversation(tree)
        self.current = conversation_id
        self.listed.emit()
        self.changed.emit()
        wanted = self.overrides(conversation_id).model
        if wanted is not None and wanted != self.replies.model_path:
            self.model_wanted.emit(wanted)
        return True

    def overrides(self, conversation_id: int | None = None) -> Overrides:
        """A conversation's own settings over the defaults (the current one's by default)."""
        cid = self.current if conversation_id is None else conversation_id
        if cid is None or cid < 0:
            return Overrides()
        try:
            return Overrides.read(self.store.settings(cid))
        except ArborError:  # gone, or unreadable: the defaults serve
            return Overrides()

    def set_overrides(self, overrides: Overrides) -> bool:
        """Give the current conversation its own settings (saved with it)."""
        cid = self.current
        if cid is None:
            return False
        if not self.attempt(lambda: self.store.set_settings(
                cid, overrides.write(self.store.settings(cid)))):
            return False
        described = overrides.describe()
        self.notice.emit(f"This conversation uses {described}." if described
                         else "This conversation uses the default settings.", 6000)
        return True

    def open_first(self) -> None:
        """The newest conversation, or a new one when there is none."""
        conversations, _ = self.listing()
        if not conversations or not self.open_conversation(conversations[0].id):
            self.new_conversation()

    def step_conversation(self, step: int) -> None:
        """The next or previous conversation in the sidebar's order (newest first)."""
        ids = [c.id for c in self.listing()[0]]
        if ids:
            index = ids.index(self.current) if self.current in ids else 0
            self.open_conversation(ids[(index + step) % len(ids)])

    def rename(self, conversation_id: int, title: str) -> None:
        if title.strip() and self.attempt(lambda: self.store.rename(conversation_id,
                                                                    title.strip())):
            self.listed.emit()

    def delete_conversation(self, conversation_id: int) -> None:
        if not self.attempt(lambda: self.store.delete(conversation_id)):
            return

        def undo() -> None:
            self.store.undelete(conversation_id)
            self.open_conversation(conversation_id)

        self._push_undo("Conversation deleted", undo)
        self.conversations.pop(conversation_id, None)
        if self.current == conversation_id:
            self.current = None
        self.open_first()

    def fork(self, node_id: int) -> None:
        """The path up to `node_id` as a new conversation, which opens."""
        assert self.current is not None
        source = self.current
        cid = self.fetch(lambda: self.store.fork(source, node_id))
        if cid is not None:
            self.open_conversation(cid)

    # --- messages: each one a call into the core, then one transaction ------------------------

    def send(self, text: str, documents: Sequence[Document] = ()) -> bool:
        """A user message (with any documents attached) at the active leaf, answered. False
        (the composer keeps the text and the documents) when it could not be sent now or
        could not be saved."""
        if self.current is None or self.replies.refuse():
            return False
        self.tools.cancel()  # a new message: the calls waiting are not run
        leaf = self.tree.active_leaf
        change = self.conversation.send(text, documents)
        if not self._persist(change, leaf):
            return False
        self._title_from_first_message(
            self.current, text or (documents[0].name if documents else ""))
        self.replies.start(self.current, change)
        return True

    def _title_from_first_message(self, conversation_id: int, text: str) -> None:
        """A conversation still called "New conversation" takes its title from its first
        message (a title the user chose is kept)."""
        if sum(1 for n in self.tree.nodes() if n.role is Role.USER) != 1:
            return
        current = self.fetch(lambda: self.store.title(conversation_id))
        title = title_from(text)
        if current == NEW_TITLE and title != NEW_TITLE:
            self.rename(conversation_id, title)

    def edit(self, node_id: int, text: str, *, answer: bool = True) -> None:
        """A new version beside the old one; a user message gets a new reply (unless not
        `answer`: there is no engine to give one). Submitted while a reply streams, the edit
        waits for the reply to stop (it is stopped), never lost."""
        self.replies.editing = None
        if self.current is None:
            return
        self.tools.cancel()
        if self.replies.streaming is not None:
            self.replies.defer_edit(self.current, node_id, text)
            return
        if answer and self.replies.refuse():
            return
        leaf = self.tree.active_leaf
        change = self.conversation.edit(node_id, text)
        if self._persist(change, leaf) and change.reply is not None and answer:
            self.replies.start(self.current, change)
        self.changed.emit()

    def regenerate(self, node_id: int | None = None) -> None:
        """A new version of a reply (None: the active branch's last message, if a reply)."""
        if self.current is None or self.replies.refuse():
            return
        if node_id is None and (node_id := self._last_reply()) is None:
            return
        self.tools.cancel()
        try:
            change = self.conversation.regenerate(node_id)
        except TreeError:
            return
        self.replies.start(self.current, change)

    def continue_reply(self, node_id: int | None = None) -> None:
        """More of a reply, an interrupted one typically (None: the active branch's last)."""
        if self.current is None or self.replies.refuse():
            return
        if node_id is None and (node_id := self._last_reply()) is None:
            return
        if self.tree.node(node_id).role is not Role.ASSISTANT:
            return
        self.tools.cancel()
        self.replies.start(self.current, self.conversation.continue_reply(node_id))

    def set_system_prompt(self, text: str) -> None:
        """Later messages keep their text; the next reply is prepared with the new
        instructions (checkpoints of the old prefix no longer match, by construction)."""
        if self.current is None:
            return
        if self.replies.answering(self.current):
            self.replies.refuse()  # says why
            return
        root = self.tree.root
        before = root.text, root.tokens
        change = self.conversation.set_system(text)
        if change.nodes and not self.save(self.current, change.nodes):
            root.text, root.tokens = before  # not saved: not shown either
        self.changed.emit()

    def set_tools(self, tools: list[dict[str, Any]], servers: dict[str, str]) -> bool:
        """The tools the current conversation offers (OpenAI's function tools) and the MCP
        server of each; saved with it, rendered into the next reply's prompt."""
        if self.current is None:
            return False
        if self.replies.answering(self.current):
            self.replies.refuse()  # says why
            return False
        root = self.tree.root
        before = dict(root.meta), root.tokens
        change = self.conversation.set_tools(tools, servers)
        if change.nodes and not self.save(self.current, change.nodes):
            root.meta, root.tokens = before  # not saved: not used either
            return False
        self.changed.emit()
        return True

    def answer_calls(self, conversation_id: int, reply_id: int,
                     results: list[tuple[ToolCall, str]]) -> bool:
        """A reply's calls have their results (engine.core.conversation): saved as tool
        nodes, and the model answers them."""
        conversation = self.conversations.get(conversation_id)
        if conversation is None or reply_id not in conversation.tree:
            return False
        leaf = conversation.tree.active_leaf
        try:
            change = conversation.answer_calls(reply_id, results)
        except TreeError:
            return False
        if not self._persist(change, leaf, conversation_id):
            return False
        self.changed.emit()
        if self.replies.model is None or self.replies.streaming is not None:
            self.notice.emit("The tools' results are kept; press Continue to have them "
                             "answered.", 8000)
            return True
        self.replies.start(conversation_id, change)
        return True

    def rewind(self, node_id: int) -> None:
        self._navigate(lambda c: c.rewind(node_id))

    def switch_variant(self, node_id: int, variant: int) -> None:
        if self._navigate(lambda c: c.switch(node_id, variant)):
            self.focus_node.emit(self.tree.siblings(node_id)[variant])

    def activate_node(self, node_id: int) -> None:
        """A tree panel click: that node's branch becomes active; the chat shows the node."""
        if self.current is not None and node_id in self.tree and self._navigate(
                lambda c: c.activate(node_id)):
            self.focus_node.emit(node_id)

    def delete_branch(self, node_id: int) -> None:
        if self.current is None or self.replies.answering(self.current):
            return  # never delete under a streaming reply
        cid = self.current
        try:
            change = self.conversation.delete_branch(node_id)
        except TreeError:
            return  # the system prompt
        assert change.undo is not None
        branch = change.undo
        if not self.save(cid, [], deleted=change.deleted):
            self.conversation.restore(branch)  # what the views show is what is saved
            return
        self.replies.send(ForgetRequest(cid, tuple(change.deleted)))

        def undo() -> None:
            self.open_conversation(cid)  # loaded again if it was closed since
            restored = self.conversations[cid].restore(branch)
            self.store.save(cid, self.conversations[cid].tree, list(restored.nodes))
            self.changed.emit()

        self._push_undo("Branch deleted", undo)
        self.changed.emit()

    def undo(self) -> None:
        if not self._undo:
            return
        what, action = self._undo.pop()
        if self.attempt(action):
            self.notice.emit(f"Undone: {what.lower()}.", 4_000)

    # --- persistence -------------------------------------------------------------------------

    def save(self, conversation_id: int, nodes: Sequence[Node],
             deleted: Sequence[int] = ()) -> bool:
        """One transaction; False (and one message) if the store refused it."""
        conversation = self.conversations.get(conversation_id)
        if conversation is None:
            return False
        tree = conversation.tree
        return self.attempt(lambda: self.store.save(conversation_id, tree, list(nodes),
                                                    deleted=deleted))

    def attempt(self, action: Callable[[], object]) -> bool:
        """Run a store action; a failure is one message to the user (and False), never a
        traceback."""
        try:
            action()
        except ArborError as exc:
            self.error.emit(str(exc))
            return False
        return True

    def fetch(self, action: Callable[[], T]) -> T | None:
        """Run a store action that returns a value; None (and one message) if it failed."""
        try:
            return action()
        except ArborError as exc:
            self.error.emit(str(exc))
            return None

    # --- internals ---------------------------------------------------------------------------

    def _persist(self, change: Change, leaf: int, conversation_id: int | None = None) -> bool:
        """Save the nodes a message operation added (to the current conversation, unless
        another is named); if the store refuses, they leave the tree again and `leaf` is the
        active leaf as before."""
        cid = self.current if conversation_id is None else conversation_id
        assert cid is not None
        if self.save(cid, change.nodes, change.deleted):
            return True
        tree = self.conversations[cid].tree
        for node in change.nodes:
            if node.id in tree:
                tree.delete_branch(node.id)
        if leaf in tree:
            tree.set_active(leaf)
        self.changed.emit()
        return False

    def _navigate(self, operation: Callable[[Conversation], Change]) -> bool:
        """Rewind, switch, activate: only the active branch moves (pointers are saved)."""
        if self.current is None:
            return False
        try:
            operation(self.conversation)
        except TreeError:
            return False
        self.save(self.current, [])
        self.changed.emit()
        return True

    def _last_reply(self) -> int | None:
        """The active branch's last message if it is a reply."""
        last = self.tree.node(self.tree.active_leaf)
        return last.id if last.role is Role.ASSISTANT else None

    def _push_undo(self, what: str, undo: Callable[[], None]) -> None:
        self._undo.append((what, undo))
        self.notice.emit(f"{what}. Ctrl+Z to undo.", 8_000)
