"""Every operation a user applies to a conversation, once, without Qt and without a model.

`Conversation` wraps one tree. Each operation changes the tree and returns a `Change`: the
nodes to persist, the ids deleted, and, where the model must answer, a `ReplyJob` saying what
to answer. Running the job (prepare, generate, finish) is the engine's business
(`engine.service.session.Session` on one thread; the window sends it to its engine process).
Undo of a deleted branch lives here too, so every front end undoes the same way.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.core.attachments import DOCUMENTS, Document, documents_of
from engine.core.reasoning import OPENED, is_opened
from engine.core.results import LEFT_OUT, FinishReason, Rendered, ReplyResult
from engine.core.tools import TOOL_CALL_ID, TOOL_SERVERS, TOOLS, ToolCall, calls_of
from engine.core.tree import Node, NodeStatus, Role, Tree, TreeError


@dataclass(frozen=True)
class ReplyJob:
    """The model must answer `parent` (a user message, or a tool's result): a new reply, or
    more of `resume`."""

    parent: int
    resume: int | None = None


@dataclass(frozen=True)
class DeletedBranch:
    """What `undo` needs to put a deleted branch back."""

    nodes: tuple[Node, ...]  # the branch's top first, parents before children
    position: int  # among its parent's children
    leaf: int  # the active leaf before the delete


@dataclass(frozen=True)
class Change:
    nodes: tuple[Node, ...] = ()  # to persist (new or changed)
    deleted: tuple[int, ...] = ()
    reply: ReplyJob | None = None
    undo: DeletedBranch | None = None  # a delete: how to take it back


@dataclass(frozen=True)
class ReplyStart:
    """A reply job under way: the reply node (streaming, to persist now), what to prepare."""

    reply: Node
    path: tuple[Node, ...]  # root .. the message being answered
    resume: Node | None  # the reply being continued, or None for a new one
    was: NodeStatus  # the continued reply's status before, to put back if nothing comes
    was_text: str = ""  # the continued reply's text before


@dataclass
class Conversation:
    tree: Tree
    _undo: list[DeletedBranch] = field(default_factory=list)
    replies: int = 0  # reply jobs seeded so far (see reply_seed)

    def reply_seed(self, base: int | None) -> int:
        """The sampling seed of the next reply job. With a base seed the n-th reply of this
        conversation gets base + n: reproducible, and a regenerate still differs. Without one,
        a fresh seed each time. Every front end seeds through here."""
        ordinal, self.replies = self.replies, self.replies + 1
        if base is None:
            return secrets.randbelow(0x7FFFFFFF)
        return (base + ordinal) & 0x7FFFFFFF

    # --- messages -------------------------------------------------------------------------

    def send(self, text: str, documents: Sequence[Document] = ()) -> Change:
        """A user message at the active leaf, with any documents attached, to be answered."""
        message = self.tree.add_child(self.tree.active_leaf, Role.USER, text)
        if documents:
            message.meta[DOCUMENTS] = [d.for_message(text).to_meta() for d in documents]
        return Change(nodes=(message,), reply=ReplyJob(message.id))

    def edit(self, node_id: int, text: str) -> Change:
        """A new version of a message beside the old one. A user message gets a reply; an
        assistant message just takes the text (and follows the same prompt: if that opened
        the reasoning, the new text starts inside it too)."""
        old = self.tree.node(node_id)
        if old.role is Role.SYSTEM:
            raise TreeError("the system prompt is not a message; set it with `system`")
        new = self.tree.add_sibling(node_id, text)
        if old.role is Role.ASSISTANT and is_opened(old.meta):
            new.meta[OPENED] = True
        if old.role is Role.TOOL and TOOL_CALL_ID in old.meta:
            new.meta[TOOL_CALL_ID] = old.meta[TOOL_CALL_ID]  # the same call, another result
        if old.role is Role.USER and DOCUMENTS in old.meta:
            # Another question on the same documents (a searched one is searched again).
            new.meta[DOCUMENTS] = [d.for_message(text).to_meta()
                                   for d in documents_of(old.meta)]
        answered = new.role in (Role.USER, Role.TOOL)
        return Change(nodes=(new,), reply=ReplyJob(new.id) if answered else None)

    def regenerate(self, node_id: int | None = None) -> Change:
        """A new version of any reply (or a reply to a user message); None: the active
        path's last message. The old versions stay."""
        node = self.tree.node(self.tree.active_leaf if node_id is None else node_id)
        parent = node.parent if node.role is Role.ASSISTANT else node.id
        if node.role is Role.SYSTEM or parent is None:
            raise TreeError("there is no message to regenerate a reply to")
        if self.tree.node(parent).role not in (Role.USER, Role.TOOL):
            raise TreeError("only a reply to a user message or a tool's result can be "
                            "regenerated")
        self.tree.set_active(parent)
        return Change(reply=ReplyJob(parent))

    def continue_reply(self, node_id: int | None = None) -> Change:
        """More of a reply (an interrupted one, typically); None: the active leaf. A user
        message at the active leaf (after a rewind) gets its first reply."""
        node = self.tree.node(self.tree.active_leaf if node_id is None else node_id)
        if node.role in (Role.USER, Role.TOOL):
            self.tree.set_active(node.id)
            return Change(reply=ReplyJob(node.id))
        if node.role is not Role.ASSISTANT or node.parent is None:
            raise TreeError("only a reply can be continued")
        self.tree.set_active(node.id)
        return Change(reply=ReplyJob(node.parent, resume=node.id))

    def set_system(self, text: str) -> Change:
        """The conversation's system prompt. The root is rendered again for the next reply;
        later messages keep their tokens (docs/architecture.md, "Tokens belong to nodes")."""
        root = self.tree.root
        if root.text == text:
            return Change()
        root.text = text
        root.tokens = None
        return Change(nodes=(root,))

    def set_tools(self, tools: list[dict[str, Any]], servers: dict[str, str]) -> Change:
        """The tools this conversation offers the model (OpenAI's function tools) and the MCP
        server of each (by tool name). Like the system prompt, they are part of the root's
        rendering: the next reply renders it again."""
        root = self.tree.root
        if (root.meta.get(TOOLS) or []) == tools and (root.meta.get(TOOL_SERVERS) or {}) == servers:
            return Change()
        for key, value in ((TOOLS, tools), (TOOL_SERVERS, servers)):
            if value:
                root.meta[key] = value
            else:
                root.meta.pop(key, None)
        root.tokens = None
        return Change(nodes=(root,))

    def answer_calls(self, reply_id: int, results: list[tuple[ToolCall, str]]) -> Change:
        """The results of a reply's calls, as `tool` nodes one under the other (in the
        order of the calls), and the job of answering the last one."""
        reply = self.tree.node(reply_id)
        made = {call.id for call in calls_of(reply.meta)}
        if reply.role is not Role.ASSISTANT or not results or not all(
                call.id in made for call, _ in results):
            raise TreeError("only the calls a reply made can be answered")
        nodes: list[Node] = []
        parent = reply_id
        for call, text in results:
            node = self.tree.add_child(parent, Role.TOOL, text)
            node.meta[TOOL_CALL_ID] = call.id
            nodes.append(node)
            parent = node.id
        return Change(nodes=tuple(nodes), reply=ReplyJob(parent))

    # --- a reply's lifetime (the model's half runs in engine.llm.reply) -------------------------

    def start_reply(self, job: ReplyJob) -> ReplyStart:
        """The reply exists, streaming, before its prompt is prepared: persist it, then run
        the job on `path` (and `resume`)."""
        path = tuple(self.tree.path_to(job.parent))
        if job.resume is None:
            reply = self.tree.add_child(job.parent, Role.ASSISTANT, "",
                                        status=NodeStatus.STREAMING)
            return ReplyStart(reply, path, None, NodeStatus.STREAMING)
        resume = self.tree.node(job.resume)
        was, resume.status = resume.status, NodeStatus.STREAMING
        return ReplyStart(resume, path, resume, was, resume.text)

    def finish_reply(self, reply_id: int, result: ReplyResult) -> Change:
        """A reply came back: its text, tokens and status; path nodes rendered for it keep
        their tokens. A stopped reply that said nothing leaves no empty node behind."""
        changed = self.adopt_tokens(result.rendered)
        reply = self.tree.node(reply_id)
        if result.finish is FinishReason.CANCELLED and not result.text:
            return Change(nodes=tuple(changed), deleted=tuple(self.tree.delete_branch(reply_id)))
        reply.text = result.text
        reply.tokens = result.tokens
        reply.meta.pop(LEFT_OUT, None)  # what this run read, not an earlier one
        reply.meta.update(dict(result.meta))
        reply.meta["finish"] = result.finish.value
        reply.status = (NodeStatus.INTERRUPTED if result.finish is FinishReason.CANCELLED
                        else NodeStatus.COMPLETE)
        return Change(nodes=(*changed, reply))

    def fail_reply(self, start: ReplyStart) -> Change:
        """A reply that failed or was stopped before it finished: kept as interrupted if it
        says anything (it can be continued), else taken back (a continued reply gets its old
        status again)."""
        reply = start.reply
        if reply.id not in self.tree:
            return Change()
        if start.resume is None and not reply.text:
            return Change(deleted=tuple(self.tree.delete_branch(reply.id)))
        reply.status = start.was if reply.text == start.was_text else NodeStatus.INTERRUPTED
        return Change(nodes=(reply,))

    def adopt_tokens(self, rendered: Rendered) -> list[Node]:
        """Nodes that still have no tokens take the ones the engine rendered for them (the
        prefix of a path never changes after that); all of them are returned, to persist (an
        engine on this thread has set them in place already)."""
        changed: list[Node] = []
        for node_id, tokens in rendered:
            node = self.tree.node(node_id) if node_id in self.tree else None
            if node is not None and node.tokens in (None, tokens):  # set in place, or not yet
                node.tokens = tokens
                changed.append(node)
        return changed

    def warm_path(self, editing: int | None = None) -> list[Node]:
        """What the next prompt will most likely start with, to prepare while the user reads:
        the parent of the message being edited, or the active branch (its last reply is then
        decoded again in one batch). Nothing when the branch ends in an unfinished reply
        (`warm_target` prepares its continuation)."""
        path, resume = self.warm_target(editing)
        return path if resume is None else []

    def warm_target(self, editing: int | None = None) -> tuple[list[Node], Node | None]:
        """What to prepare while the user reads, as (path, resume): `warm_path`'s path with
        no resume, or, where the active branch ends in an interrupted reply after complete
        messages, the path to its parent and that reply, to prepare exactly the prompt that
        continues it (Generator.warm), so Continue decodes nothing. A streaming reply is
        never warmed; nothing to warm is ([], None)."""
        if editing is not None and editing in self.tree:
            parent = self.tree.node(editing).parent
            return (self.tree.path_to(parent) if parent is not None else []), None
        path = self.tree.active_path()
        *before, leaf = path
        if all(node.status is NodeStatus.COMPLETE for node in before):
            if leaf.status is NodeStatus.COMPLETE:
                return path, None
            if leaf.status is NodeStatus.INTERRUPTED and leaf.role is Role.ASSISTANT and before:
                return before, leaf
        return [], None

    # --- navigation -------------------------------------------------------------------------

    def rewind(self, node_id: int) -> Change:
        self.tree.rewind(node_id)
        return Change()

    def switch(self, node_id: int, variant: int) -> Change:
        self.tree.switch_variant(node_id, variant)
        return Change()

    def activate(self, node_id: int) -> Change:
        """As a click in the tree panel: the node's branch, followed to its last-active leaf."""
        self.tree.set_active(self.tree.follow_last_active(node_id))
        return Change()

    # --- structure --------------------------------------------------------------------------

    def delete_branch(self, node_id: int) -> Change:
        """Remove a message and everything after it; `undo` brings it back."""
        node = self.tree.node(node_id)
        if node.parent is None:
            raise TreeError("the system prompt cannot be deleted")
        position = self.tree.node(node.parent).children.index(node_id)
        leaf = self.tree.active_leaf
        kept = tuple(self.tree.node(i) for i in self.tree.subtree(node_id))
        removed = self.tree.delete_branch(node_id)
        branch = DeletedBranch(kept, position, leaf)
        self._undo.append(branch)
        return Change(deleted=tuple(removed), undo=branch)

    @property
    def can_undo(self) -> bool:
        return bool(self._undo)

    def undo(self) -> Change:
        """Put the last deleted branch back: same ids, same place, same active leaf."""
        if not self._undo:
            raise TreeError("there is nothing to undo")
        return self.restore(self._undo[-1])

    def restore(self, branch: DeletedBranch) -> Change:
        """Put a deleted branch back (a front end with an undo stack of its own calls this
        with the `Change.undo` of the delete)."""
        self.tree.reinsert(list(branch.nodes), branch.position, active_leaf=branch.leaf)
        if branch in self._undo:
            self._undo.remove(branch)
        return Change(nodes=branch.nodes)

    def fork(self, node_id: int) -> Tree:
        """A new conversation holding the path from the root to `node_id`, tokens and all
        (so its prefix, and the checkpoints of it, are the same)."""
        path = self.tree.path_to(node_id)
        tree = Tree(path[0].text)
        tree.root.tokens = path[0].tokens
        for node in path[1:]:
            copy = tree.add_child(tree.active_leaf, node.role, node.text, status=node.status)
            copy.tokens, copy.created, copy.meta = node.tokens, node.created, dict(node.meta)
        return tree
