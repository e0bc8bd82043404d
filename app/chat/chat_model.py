"""The chat view's rows and model: the active path of a conversation tree as immutable rows.

`ChatModel` holds immutable `MessageRow` snapshots (built with `rows_from_tree`) and never
touches a live `Tree`, so the tree may belong to another thread. `set_rows` diffs the new
snapshot against the old one and emits the smallest change (dataChanged / a removed tail /
an inserted tail); `update_text` grows a streaming reply in place. A message that stops
streaming is reported with `finished`.

For screen readers, each row's accessible text says who wrote it, which version it is ("version
2 of 3") and what it says; its accessible description names the keys for its painted controls
(the version switcher, the copy buttons of its code blocks, the reasoning's disclosure).

A reply's reasoning (`<think>...</think>`, split by engine.core.reasoning) is shown above its
answer, folded once the answer has started and open while only reasoning has come; the user's
choice per message (`toggle_reasoning`) lives in the model while its conversation is shown,
never on disk. A tool's result is folded the same way, under a header naming the call it
answers; a reply's calls (`calls`) are not part of its text but blocks of their own below it
(app.chat.tool_blocks).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import IntEnum
from typing import Any

from PySide6.QtCore import (
    QAbstractListModel,
    QByteArray,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    Signal,
)
from PySide6.QtGui import QKeySequence, QTextDocument

from app.chat.code_blocks import fences
from app.chat.tool_text import line_count, lines_label, result_text, spoken_call
from app.look.actions import spec
from engine.core.attachments import Document, Reading, documents_of
from engine.core.reasoning import Reasoning, ReasoningState, is_opened, split_reasoning
from engine.core.results import LEFT_OUT
from engine.core.tools import TOOL_CALLS, ToolCall, call_label, calls_of, shown_text
from engine.core.tree import Node, NodeStatus, Role, Tree

log = logging.getLogger(__name__)

ModelIndex = QModelIndex | QPersistentModelIndex

USER = "user"
ASSISTANT = "assistant"
TOOL = "tool"
COMPLETE = "complete"
STREAMING = "streaming"
INTERRUPTED = "interrupted"


# --- the rows ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MessageRow:
    """An immutable snapshot of one message of the active path."""

    node_id: int
    role: str  # "user" | "assistant"
    text: str
    status: str  # "complete" | "streaming" | "interrupted"
    variant: int  # 0-based index among its siblings
    variants: int  # number of siblings, itself included
    checkpoint: str | None = None
    created: float = 0.0  # seconds since the epoch; 0: unknown (no time shown)
    # The user's choice for the reply's reasoning: shown (True), folded (False), or None:
    # shown while only reasoning has come, folded once the answer has started.
    reasoning_shown: bool | None = None
    # The last reply of the branch left this message out: the context was full
    # (engine.core.overflow). `context_starts`: the first message it read after them.
    outside: bool = False
    context_starts: bool = False
    # The reply started inside its reasoning: its generation prompt opened the block, so
    # its text holds only the closing marker (engine.core.reasoning.OPENED).
    reasoning_opened: bool = False
    # A tool's result: the call it answers, as its fold's header says it ("weather(…)").
    call: str = ""
    # A reply's tool calls, shown as blocks of their own below its text (not part of it).
    calls: tuple[ToolCall, ...] = ()
    # A user's message: the documents attached to it, folded above its text.
    documents: tuple[Document, ...] = ()


def reasoning_of(row: MessageRow) -> Reasoning | None:
    """A reply's reasoning and answer, or None when it has no reasoning (or is the user's).
    A tool's result is folded the same way: all of it is the fold, under a header naming
    the call."""
    if row.role == TOOL:
        return Reasoning(row.text, "", ReasoningState.CLOSED)
    if row.role == USER and row.documents:
        return Reasoning(documents_text(row.documents), row.text, ReasoningState.CLOSED)
    if row.role != ASSISTANT or ("think" not in row.text  # the markers all hold "think"
                                 and not row.reasoning_opened):
        return None
    split = split_reasoning(row.text, row.reasoning_opened)
    return None if split.state is ReasoningState.NONE else split


def reasoning_shown(row: MessageRow, split: Reasoning) -> bool:
    """Whether `row`'s reasoning is unfolded: the user's choice, else open while the
    reasoning has not ended."""
    if row.reasoning_shown is not None:
        return row.reasoning_shown
    return split.state is ReasoningState.OPEN


def reasoning_label(row: MessageRow, split: Reasoning) -> str:
    """The disclosure's header line: "Reasoning · 312 words", and whether it is unfinished;
    a tool's result: "weather({"city": "Oslo"}) · 3 lines" (the lines it shows)."""
    if row.role == TOOL:
        return f"{row.call or 'Result'} · {lines_label(line_count(result_text(row.text)))}"
    if row.role == USER and row.documents:
        return documents_label(row.documents)
    words = "1 word" if split.words == 1 else f"{split.words:,} words"
    if split.state is ReasoningState.CLOSED:
        return f"Reasoning · {words}"
    if row.status == STREAMING:
        return f"Reasoning… · {words}"
    return f"Reasoning, unfinished · {words}"


def size_label(size: int) -> str:
    """A file's size in words: "812 B", "34 KB", "2.5 MB"."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.0f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def documents_text(documents: Sequence[Document]) -> str:
    """A message's documents as its fold shows them, unfolded: each under its name."""
    return "\n\n".join(f"── {d.name} ──\n{d.text}" for d in documents)


def documents_label(documents: Sequence[Document]) -> str:
    """The fold's header: "report.pdf · 34 KB · 120 lines", or "3 documents: ..."."""
    if len(documents) == 1:
        (one,) = documents
        return (f"{one.name} · {size_label(one.size)} · "
                f"{_how_read(one) or lines_label(line_count(one.text))}")
    names = ", ".join(d.name + (f" ({how})" if (how := _how_read(d)) else "")
                      for d in documents)
    return f"{len(documents)} documents: {names}"


def _how_read(document: Document) -> str:
    """What of a document the model read, when not all of it."""
    if document.reading is Reading.START:
        return f"its start ({document.budget:,} of {document.whole:,} characters)"
    if document.reading is Reading.SEARCH:
        found = document.text.count("[passage ")
        return f"searched: {found} passage{'s' * (found != 1)}"
    return ""


def message_time(created: float, now: float | None = None) -> str:
    """When a message was written, for its tooltip: the time today, else the date too."""
    if created <= 0:
        return ""
    moment = datetime.fromtimestamp(created)
    today = datetime.fromtimestamp(time.time() if now is None else now).date()
    if moment.date() == today:
        return moment.strftime("%H:%M")
    return moment.strftime("%Y-%m-%d %H:%M")


def rows_from_tree(tree: Tree, checkpoints: Mapping[int, str] | None = None) -> list[MessageRow]:
    """Snapshot the tree's active path (system root excluded) as rows for `ChatModel`.

    `checkpoints` maps node ids to a checkpoint label shown on that message. Call this on the
    thread that owns the tree and hand the (immutable) result to the GUI thread.
    """
    rows: list[MessageRow] = []
    marks = checkpoints or {}
    messages = tree.messages()
    first_read = context_start(messages)
    for index, node in enumerate(messages):
        siblings = tree.siblings(node.id)
        rows.append(
            MessageRow(
                node_id=node.id,
                role=str(node.role.value),
                text=node.text,
                status=str(node.status.value),
                variant=siblings.index(node.id),
                variants=len(siblings),
                checkpoint=marks.get(node.id),
                created=node.created,
                outside=index < first_read,
                context_starts=0 < index == first_read,
                reasoning_opened=is_opened(node.meta),
                call=call_label(messages[:index], node),
                calls=calls_of(node.meta) if node.role is Role.ASSISTANT else (),
                documents=documents_of(node.meta) if node.role is Role.USER else (),
            )
        )
    return rows


def context_start(messages: Sequence[Node]) -> int:
    """The index of the first message the branch's last reply read (0: it read them all):
    the reply counts in its meta the oldest messages it left out when the context was full."""
    for index in range(len(messages) - 1, -1, -1):
        node = messages[index]
        if node.role is Role.ASSISTANT and node.status is not NodeStatus.STREAMING:
            left_out = node.meta.get(LEFT_OUT)
            return left_out if isinstance(left_out, int) and 0 < left_out < index else 0
    return 0


# --- the model ---------------------------------------------------------------------------


class ChatRole(IntEnum):
    """The model's custom item data roles."""

    NodeIdRole = Qt.ItemDataRole.UserRole + 1
    RoleRole = Qt.ItemDataRole.UserRole + 2
    TextRole = Qt.ItemDataRole.UserRole + 3
    StatusRole = Qt.ItemDataRole.UserRole + 4
    VariantRole = Qt.ItemDataRole.UserRole + 5
    VariantsRole = Qt.ItemDataRole.UserRole + 6
    CheckpointRole = Qt.ItemDataRole.UserRole + 7
    ReasoningShownRole = Qt.ItemDataRole.UserRole + 8  # the user's choice (None: automatic)
    OutsideRole = Qt.ItemDataRole.UserRole + 9  # left out of the last reply's context
    ContextStartsRole = Qt.ItemDataRole.UserRole + 10  # the first message it read after them
    ReasoningOpenedRole = Qt.ItemDataRole.UserRole + 11  # the reply began inside reasoning
    CallRole = Qt.ItemDataRole.UserRole + 12  # a tool's result: the call it answers
    CallsRole = Qt.ItemDataRole.UserRole + 13  # a reply's tool calls (ToolCall tuple)


_ROLE_FIELDS: dict[int, str] = {
    ChatRole.NodeIdRole: "node_id",
    ChatRole.RoleRole: "role",
    ChatRole.TextRole: "text",
    ChatRole.StatusRole: "status",
    ChatRole.VariantRole: "variant",
    ChatRole.VariantsRole: "variants",
    ChatRole.CheckpointRole: "checkpoint",
    ChatRole.ReasoningShownRole: "reasoning_shown",
    ChatRole.OutsideRole: "outside",
    ChatRole.ContextStartsRole: "context_starts",
    ChatRole.ReasoningOpenedRole: "reasoning_opened",
    ChatRole.CallRole: "call",
    ChatRole.CallsRole: "calls",
}

_ROLE_NAMES: dict[int, bytes] = {
    ChatRole.NodeIdRole: b"nodeId",
    ChatRole.RoleRole: b"role",
    ChatRole.TextRole: b"text",
    ChatRole.StatusRole: b"status",
    ChatRole.VariantRole: b"variant",
    ChatRole.VariantsRole: b"variants",
    ChatRole.CheckpointRole: b"checkpoint",
    ChatRole.ReasoningShownRole: b"reasoningShown",
    ChatRole.OutsideRole: b"outside",
    ChatRole.ContextStartsRole: b"contextStarts",
    ChatRole.ReasoningOpenedRole: b"reasoningOpened",
    ChatRole.CallRole: b"call",
    ChatRole.CallsRole: b"calls",
}

_DISPLAY = int(Qt.ItemDataRole.DisplayRole)
_ACCESSIBLE = int(Qt.ItemDataRole.AccessibleTextRole)
_ACCESSIBLE_DESCRIPTION = int(Qt.ItemDataRole.AccessibleDescriptionRole)
_TOOLTIP = int(Qt.ItemDataRole.ToolTipRole)  # the message's time, on hover

# What the accessible texts depend on.
_SPOKEN_FIELDS = ("role", "text", "status", "variant", "variants", "reasoning_shown",
                  "outside", "reasoning_opened", "call", "calls")

_SPEAKERS = {USER: "You", ASSISTANT: "Assistant", TOOL: "Tool result"}


def _keys(action: str) -> str:
    return " or ".join(QKeySequence(key).toString(QKeySequence.SequenceFormat.NativeText)
                       for key in spec(action).keys)


@functools.lru_cache(maxsize=64)
def spoken_text(markdown: str) -> str:
    """A message as a screen reader should say it: the text of its Markdown, no marks."""
    doc = QTextDocument()
    doc.setMarkdown(markdown)
    return doc.toPlainText()


def accessible_text(row: MessageRow) -> str:
    """What a screen reader says for a message: who, which version, its state, its text; a
    reply's calls after its text; a tool's result as it came, once unfolded."""
    parts = [_SPEAKERS.get(row.role, row.role)]
    if row.variants > 1:
        parts.append(f"version {row.variant + 1} of {row.variants}")
    if row.status == STREAMING:
        parts.append("still writing")
    elif row.status == INTERRUPTED:
        parts.append("interrupted")
    if row.outside:
        parts.append("outside the context, the model no longer reads it")
    split = reasoning_of(row)
    if row.role == TOOL and split is not None:
        size = lines_label(line_count(result_text(row.text)))
        of = f" of {row.call}" if row.call else ""
        if not reasoning_shown(row, split):
            parts.append(f"result{of} collapsed, {size}")
            return ", ".join(parts)
        parts.append(f"result{of}, {size}")
        return f"{', '.join(parts)}: {row.text}"
    if split is None:
        return f"{', '.join(parts)}: {_with_calls(spoken_text(row.text), row)}"
    words = "1 word" if split.words == 1 else f"{split.words} words"
    unfinished = "" if split.state is ReasoningState.CLOSED else "unfinished "
    if not reasoning_shown(row, split):
        parts.append(f"{unfinished}reasoning collapsed, {words}")
        return f"{', '.join(parts)}: {_with_calls(spoken_text(split.answer), row)}"
    parts.append(f"{unfinished}reasoning, {words}")
    said = f"{', '.join(parts)}: {spoken_text(split.reasoning)}"
    if split.answer:
        said += f" Answer: {spoken_text(split.answer)}"
    return _with_calls(said, row)


def _with_calls(said: str, row: MessageRow) -> str:
    """`said`, then each of the reply's calls: "Calls get_weather with city: Oslo." """
    calls = [f"Calls {spoken_call(call)}." for call in row.calls]
    return " ".join(part for part in (said, *calls) if part)


def copied_text(row: MessageRow) -> str:
    """What copying a message puts on the clipboard: its text as stored (a tool's result as
    it came), and a reply's calls after it as the Markdown export writes them."""
    if not row.calls:
        return row.text
    return shown_text(row.text, {TOOL_CALLS: [call.to_meta() for call in row.calls]})


def accessible_description(row: MessageRow) -> str:
    """The message's painted controls and their keys: the version switcher, the code
    blocks' copy buttons, the reasoning's (or a result's) disclosure."""
    parts: list[str] = []
    split = reasoning_of(row)
    if split is not None:
        verb = "hides" if reasoning_shown(row, split) else "shows"
        fold = "Result" if row.role == TOOL else "Reasoning"
        parts.append(f"{fold} {'shown' if verb == 'hides' else 'collapsed'}: "
                     f"{_keys('toggle_reasoning')} {verb} it")
    if row.variants > 1:
        parts.append(
            f"Version {row.variant + 1} of {row.variants}: {_keys('previous_variant')} "
            f"shows the previous version, {_keys('next_variant')} the next"
        )
    if row.role == TOOL:  # shown as it came: a fence in it is not a code block
        return ". ".join(parts) + ("." if parts else "")
    blocks = fences(row.text) if "```" in row.text or "~~~" in row.text else []
    if blocks:
        languages = ", ".join(sorted({b.language for b in blocks if b.language}))
        what = "1 code block" if len(blocks) == 1 else f"{len(blocks)} code blocks"
        if languages:
            what += f" ({languages})"
        if row.status != STREAMING:
            keys = _keys("copy_code")
            what += (f", each with a copy button: {keys} copies the code" if len(blocks) == 1
                     else f", each with a copy button: {keys} copies them one after another")
        parts.append(what)
    return ". ".join(parts) + ("." if parts else "")


def _changed_roles(old: MessageRow, new: MessageRow) -> list[int]:
    roles = [
        role for role, name in _ROLE_FIELDS.items() if getattr(old, name) != getattr(new, name)
    ]
    if old.text != new.text:
        roles.append(_DISPLAY)
    if any(getattr(old, name) != getattr(new, name) for name in _SPOKEN_FIELDS):
        roles += [_ACCESSIBLE, _ACCESSIBLE_DESCRIPTION]
    return roles


class ChatModel(QAbstractListModel):
    """One row per message of the active path, fed with immutable `MessageRow` snapshots."""

    Roles = ChatRole

    finished = Signal(int)  # node id: a message that was streaming no longer is

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._rows: list[MessageRow] = []
        self._index: dict[int, int] = {}
        self._reasoning_choices: dict[int, bool] = {}  # node id -> shown (the user's toggle)
        self._conversation: int | None = None  # whose rows these are (see set_rows)

    # --- Qt's model interface ----------------------------------------------------------

    def rowCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        """The number of messages; items have no children."""
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: ModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        """The row's field for a `ChatRole`, its text for DisplayRole, None otherwise."""
        if not index.isValid() or index.column() != 0 or not 0 <= index.row() < len(self._rows):
            return None
        row = self._rows[index.row()]
        role = int(role)
        if role == _DISPLAY:
            return row.text
        if role == _ACCESSIBLE:
            return accessible_text(row)
        if role == _ACCESSIBLE_DESCRIPTION:
            return accessible_description(row)
        if role == _TOOLTIP:
            return message_time(row.created) or None
        name = _ROLE_FIELDS.get(role)
        return None if name is None else getattr(row, name)

    def flags(self, index: ModelIndex) -> Qt.ItemFlag:
        """Messages are selectable, enabled, never editable in place, never parents."""
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return (
            Qt.ItemFlag.ItemIsEnabled
            | Qt.ItemFlag.ItemIsSelectable
            | Qt.ItemFlag.ItemNeverHasChildren
        )

    def roleNames(self) -> dict[int, QByteArray]:
        """Qt's default role names plus the `ChatRole` ones (for QML or debugging)."""
        names = dict(super().roleNames())
        names.update({role: QByteArray(name) for role, name in _ROLE_NAMES.items()})
        return names

    # --- Arbor's interface -------------------------------------------------------------

    def rows(self) -> list[MessageRow]:
        """A copy of the current rows."""
        return list(self._rows)

    def row_at(self, row: int) -> MessageRow:
        """The snapshot shown at `row` (IndexError when out of range)."""
        if not 0 <= row < len(self._rows):
            raise IndexError(f"row {row} out of range (the model has {len(self._rows)} rows)")
        return self._rows[row]

    def row_of(self, node_id: int) -> int | None:
        """The row showing `node_id`, or None when it is not on the shown path."""
        return self._index.get(node_id)

    def set_rows(self, rows: Sequence[MessageRow], conversation: int | None = None) -> None:
        """Show `rows`, emitting the smallest change against what is shown now.
        `conversation` names whose rows they are: another one forgets the reasoning folds.

        Rows are matched by node id from the top: the common prefix keeps its rows (each one
        whose fields changed gets a dataChanged with the changed roles), the old tail after it
        is removed and the new tail inserted. A full reset happens only when nothing is
        shared (another conversation), since then one reset is cheaper than two big moves.
        """
        if conversation != self._conversation:  # node ids are unique only within a tree
            self._reasoning_choices.clear()
            self._conversation = conversation
        choices = self._reasoning_choices
        new = [replace(row, reasoning_shown=choices[row.node_id])
               if row.node_id in choices and row.reasoning_shown != choices[row.node_id] else row
               for row in rows]
        old = self._rows
        shared = min(len(old), len(new))
        prefix = 0
        while prefix < shared and old[prefix].node_id == new[prefix].node_id:
            prefix += 1
        if prefix == 0 and old and new:
            self.beginResetModel()
            self._rows = new
            self._reindex()
            self.endResetModel()
            return
        changes: list[tuple[int, list[int]]] = []
        stopped: list[int] = []
        for i in range(prefix):
            if old[i] is not new[i] and old[i] != new[i]:
                changes.append((i, _changed_roles(old[i], new[i])))
                if old[i].status == STREAMING and new[i].status != STREAMING:
                    stopped.append(new[i].node_id)
                old[i] = new[i]
        self._emit_changes(changes)
        for node_id in stopped:
            self.finished.emit(node_id)
        if prefix < len(old):
            self.beginRemoveRows(QModelIndex(), prefix, len(old) - 1)
            for gone in old[prefix:]:
                self._index.pop(gone.node_id, None)
            del old[prefix:]
            self.endRemoveRows()
        if prefix < len(new):
            self.beginInsertRows(QModelIndex(), prefix, len(new) - 1)
            for i in range(prefix, len(new)):
                old.append(new[i])
                self._index[new[i].node_id] = i
            self.endInsertRows()

    def update_text(self, node_id: int, text: str, status: str = STREAMING,
                    reasoning_opened: bool | None = None) -> bool:
        """Replace one message's text and status (a streaming reply growing), and whether it
        began inside its reasoning when that is given (the engine says so as it streams).

        Emits dataChanged for that row only, with the roles that changed. Returns False (and
        changes nothing) when the node is not shown.
        """
        row = self._index.get(node_id)
        if row is None:
            log.debug("update_text for node %s, which is not shown", node_id)
            return False
        old = self._rows[row]
        opened = old.reasoning_opened if reasoning_opened is None else reasoning_opened
        if old.text == text and old.status == status and old.reasoning_opened == opened:
            return True
        new = replace(old, text=text, status=str(status), reasoning_opened=opened)
        self._rows[row] = new
        self._emit_changes([(row, _changed_roles(old, new))])
        if old.status == STREAMING and new.status != STREAMING:
            self.finished.emit(node_id)
        return True

    def toggle_reasoning(self, node_id: int) -> bool | None:
        """Fold or unfold a shown reply's reasoning; whether it is shown now (None: the node
        is not shown or has no reasoning). The choice lasts while the model does."""
        number = self._index.get(node_id)
        if number is None:
            return None
        old = self._rows[number]
        split = reasoning_of(old)
        if split is None:
            return None
        shown = not reasoning_shown(old, split)
        self._reasoning_choices[node_id] = shown
        new = replace(old, reasoning_shown=shown)
        self._rows[number] = new
        self._emit_changes([(number, _changed_roles(old, new))])
        return shown

    def clear(self) -> None:
        """Show nothing."""
        self.set_rows([])

    def _emit_changes(self, changes: list[tuple[int, list[int]]]) -> None:
        """dataChanged per run of consecutive changed rows, with the union of their roles."""
        start = 0
        while start < len(changes):
            end = start
            roles = set(changes[start][1])
            while end + 1 < len(changes) and changes[end + 1][0] == changes[end][0] + 1:
                end += 1
                roles.update(changes[end][1])
            top = self.index(changes[start][0], 0)
            bottom = self.index(changes[end][0], 0)
            self.dataChanged.emit(top, bottom, sorted(roles))
            start = end + 1

    def _reindex(self) -> None:
        self._index = {row.node_id: i for i, row in enumerate(self._rows)}
