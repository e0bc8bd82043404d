"""The chat view: the active path of a conversation tree as a list of message bubbles.

Model/view with no widget per message, so conversations of thousands of messages scroll
smoothly: `ChatModel` (app.chat.chat_model) holds the rows, `MessageDelegate`
(app.chat.message_delegate) paints them and `MessageEditor` (app.chat.message_editor) edits one in
place.

`ChatView` is the `QListView` with the per-message actions (edit, regenerate, rewind, fork,
copy, delete, previous/next version), each reported as a signal with the node id. Editing
happens in place: the delegate creates a `MessageEditor` over the one bubble being edited
(a persistent editor, so the only widget in the list) and the row grows to fit it; `ChatEditing`
(app.chat.chat_editing) opens and closes it. The model stays read-only; the view reports the new
text with `edit_submitted`. How the view scrolls is its base class's, `TailFollowingView`
(app.chat.chat_scrolling).

Code blocks have painted copy buttons (a click copies that block's exact code) and a key,
Ctrl+Alt+C, that copies the current message's blocks one after another; `notice` carries the
"Copied" for the status bar. A reply's reasoning folds and unfolds with a click on its header
or Ctrl+Shift+K on the current message (the choice is the model's). For screen readers, the
rows' accessible texts come from the model, and a reply that finishes is announced
(app.look.accessibility).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QEvent, QModelIndex, Qt, QTimer, Signal, Slot
from PySide6.QtGui import (
    QAction,
    QContextMenuEvent,
    QGuiApplication,
    QKeyEvent,
    QKeySequence,
    QMouseEvent,
)
from PySide6.QtWidgets import QAbstractItemView, QListView, QMenu, QWidget

from app.chat.chat_editing import ChatEditing
from app.chat.chat_model import (
    ASSISTANT,
    INTERRUPTED,
    STREAMING,
    TOOL,
    USER,
    ChatModel,
    MessageRow,
    ModelIndex,
    copied_text,
    reasoning_of,
    reasoning_shown,
    spoken_text,
)
from app.chat.chat_scrolling import TailFollowingView
from app.chat.message_delegate import MessageDelegate
from app.chat.message_editor import MessageEditor
from app.chat.tool_text import line_count, lines_label, result_text, spoken_call
from app.look.accessibility import announce
from app.look.actions import Scope, make_actions

log = logging.getLogger(__name__)

COPIED_SHOWN_MS = 1500  # how long a copy button says "Copied"
ANNOUNCED_CHARS = 600  # how much of a finished reply is announced
# The reasoning's fold action, named for a tool's result while one is current.
RESULT_TOGGLE = ("Show/hide res&ult", "Fold or unfold this tool's result")


class ChatView(TailFollowingView):
    """The conversation's messages, with per-message actions reported as signals.

    The view never changes a tree itself: it reports what the user asked for with the node
    id of the current message and the owner applies it and feeds new rows back. Keys (scoped
    to the view): Ctrl+E or F2 edit, Ctrl+R regenerate (assistant replies), Ctrl+Backspace
    rewind, Ctrl+Shift+F fork, Ctrl+Shift+C copy, Ctrl+Alt+C copy code (again: the next
    block), Ctrl+Shift+K show or hide a reply's reasoning or a tool's result, Delete delete,
    Alt+Left / Alt+Right previous / next version. Use it from the GUI thread only.

    Editing is in place (the edit action, or a double click on a user message): an editor
    opens over the bubble and stays open, focus or not, until Enter or Esc, or until its
    message leaves the view. Every `edit_started` is followed by exactly one
    `edit_submitted` (the new text, stripped, when it is not blank and differs) or
    `edit_cancelled` (Esc, an unchanged or blank text, another edit started, the message
    gone from the rows).
    """

    variant_requested = Signal(int, int)  # node id, wanted variant index
    edit_started = Signal(int)  # node id; the owner may warm the engine up meanwhile
    edit_submitted = Signal(int, str)  # node id, the new text (stripped)
    edit_cancelled = Signal(int)  # node id
    regenerate_requested = Signal(int)
    rewind_requested = Signal(int)
    fork_requested = Signal(int)
    copy_requested = Signal(int)
    delete_requested = Signal(int)
    notice = Signal(str, int)  # a passing message for the status bar, and its time (ms)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._chat_model = ChatModel(self)
        self._delegate = MessageDelegate(self)
        self.setModel(self._chat_model)
        self.setItemDelegate(self._delegate)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setUniformItemSizes(False)
        self.setWordWrap(True)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # A scroll bar that comes and goes changes the width, which re-lays out every message.
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)
        self.verticalScrollBar().setSingleStep(24)
        self.setMouseTracking(True)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.DefaultContextMenu)
        self.setAccessibleName("Messages")
        self._last_code_copy: tuple[int, int] | None = None  # (node id, block index)
        self._copied_timer = QTimer(self)
        self._copied_timer.setSingleShot(True)
        self._copied_timer.setInterval(COPIED_SHOWN_MS)
        self._copied_timer.timeout.connect(self._on_copied_shown)

        self._edits = ChatEditing(self, self._chat_model)
        self._edits.started.connect(self.edit_started)
        self._edits.submitted.connect(self.edit_submitted)
        self._edits.cancelled.connect(self.edit_cancelled)

        self._delegate.variant_requested.connect(self.variant_requested)
        self._delegate.code_copy_requested.connect(self.copy_code)
        self._delegate.reasoning_toggle_requested.connect(self.toggle_reasoning)
        self._actions = make_actions(Scope.CHAT, self, {
            "edit": self._on_edit, "regenerate": self._on_regenerate, "rewind": self._on_rewind,
            "fork": self._on_fork, "copy": self._on_copy, "copy_code": self._on_copy_code,
            "delete": self._on_delete, "previous_variant": self._on_previous_variant,
            "next_variant": self._on_next_variant, "toggle_reasoning": self._on_toggle_reasoning,
        })
        self.addActions(list(self._actions.values()))
        toggle = self._actions["toggle_reasoning"]
        # Its words (text, tooltip, status tip) for a reply's reasoning, and for a result.
        self._reasoning_toggle = (toggle.text(), toggle.toolTip(), toggle.statusTip())
        text, tip = RESULT_TOGGLE
        self._result_toggle = (text, f"{tip} ({toggle.shortcut().toString()})", tip)

        self.selectionModel().currentChanged.connect(self._on_current_changed)
        self._chat_model.modelReset.connect(self.update_actions)
        self._chat_model.modelAboutToBeReset.connect(self._edits.on_model_about_to_reset)
        self._chat_model.modelReset.connect(self._on_model_reset)
        self._chat_model.rowsRemoved.connect(self._edits.on_rows_removed)
        self._chat_model.rowsInserted.connect(self.update_actions)
        self._chat_model.rowsRemoved.connect(self.update_actions)
        self._chat_model.dataChanged.connect(self.update_actions)
        self._chat_model.finished.connect(self._on_finished)
        self.update_actions()

    # --- parts -------------------------------------------------------------------------

    @property
    def chat_model(self) -> ChatModel:
        """The view's model."""
        return self._chat_model

    @property
    def delegate(self) -> MessageDelegate:
        """The view's delegate."""
        return self._delegate

    @property
    def actions_by_name(self) -> dict[str, QAction]:
        """The chat's actions (app.look.actions, Scope.CHAT), by name."""
        return dict(self._actions)

    def action(self, name: str) -> QAction:
        """One of: edit, regenerate, rewind, fork, copy, delete, previous_variant, next_variant."""
        return self._actions[name]

    @property
    def edit_action(self) -> QAction:
        return self._actions["edit"]

    @property
    def regenerate_action(self) -> QAction:
        return self._actions["regenerate"]

    @property
    def rewind_action(self) -> QAction:
        return self._actions["rewind"]

    @property
    def fork_action(self) -> QAction:
        return self._actions["fork"]

    @property
    def copy_action(self) -> QAction:
        return self._actions["copy"]

    @property
    def copy_code_action(self) -> QAction:
        return self._actions["copy_code"]

    @property
    def delete_action(self) -> QAction:
        return self._actions["delete"]

    @property
    def previous_variant_action(self) -> QAction:
        return self._actions["previous_variant"]

    @property
    def next_variant_action(self) -> QAction:
        return self._actions["next_variant"]

    # --- feeding -----------------------------------------------------------------------

    def set_rows(self, rows: Sequence[MessageRow]) -> None:
        """Show `rows` (see `ChatModel.set_rows`)."""
        self._chat_model.set_rows(rows)

    def update_text(self, node_id: int, text: str, status: str = STREAMING,
                    reasoning_opened: bool | None = None) -> bool:
        """Grow a streaming reply (see `ChatModel.update_text`)."""
        return self._chat_model.update_text(node_id, text, status, reasoning_opened)

    # --- the current message -----------------------------------------------------------

    def current_row(self) -> MessageRow | None:
        """The snapshot of the current message, or None."""
        index = self.currentIndex()
        if not index.isValid():
            return None
        return self._chat_model.row_at(index.row())

    def select_node(self, node_id: int) -> bool:
        """Make `node_id` the current, selected message. False when it is not shown."""
        row = self._chat_model.row_of(node_id)
        if row is None:
            return False
        self.setCurrentIndex(self._chat_model.index(row, 0))
        return True

    @Slot(int)
    def show_node(self, node_id: int) -> None:
        """Make `node_id` current and scroll to it (after a version switch or a tree panel
        activation: the keys act on the message the user just switched)."""
        if self.select_node(node_id):
            self.scroll_to_node(node_id)

    def model(self) -> ChatModel:
        """The view's own row model (typed: QListView.model() says only QAbstractItemModel)."""
        return self._chat_model

    @Slot()
    def update_actions(self) -> None:
        """Enable the actions that make sense for the current message."""
        row = self.current_row()
        for name in ("edit", "rewind", "fork", "copy", "delete"):
            self._actions[name].setEnabled(row is not None)
        self.copy_code_action.setEnabled(
            row is not None and row.status != STREAMING and row.role != TOOL
            and ("```" in row.text or "~~~" in row.text)
        )
        self.regenerate_action.setEnabled(row is not None and row.role == ASSISTANT)
        self.previous_variant_action.setEnabled(row is not None and row.variant > 0)
        self.next_variant_action.setEnabled(row is not None and row.variant + 1 < row.variants)
        toggle = self._actions["toggle_reasoning"]
        toggle.setEnabled(row is not None and reasoning_of(row) is not None)
        text, tip, status = (self._result_toggle if row is not None and row.role == TOOL
                             else self._reasoning_toggle)
        if toggle.text() != text:
            toggle.setText(text)
            toggle.setToolTip(tip)
            toggle.setStatusTip(status)

    @Slot(QModelIndex, QModelIndex)
    def _on_current_changed(self, _current: QModelIndex, _previous: QModelIndex) -> None:
        self.update_actions()

    def _emit_for_current(self, signal: Any, name: str) -> MessageRow | None:
        row = self.current_row()
        if row is None:
            return None
        log.debug("%s requested for node %s", name, row.node_id)
        signal.emit(row.node_id)
        return row

    @Slot()
    def _on_edit(self) -> None:
        row = self.current_row()
        if row is not None:
            self.start_edit(row.node_id)

    @Slot()
    def _on_regenerate(self) -> None:
        row = self.current_row()
        if row is not None and row.role == ASSISTANT:
            self._emit_for_current(self.regenerate_requested, "regenerate")

    @Slot()
    def _on_rewind(self) -> None:
        self._emit_for_current(self.rewind_requested, "rewind")

    @Slot()
    def _on_fork(self) -> None:
        self._emit_for_current(self.fork_requested, "fork")

    @Slot()
    def _on_copy(self) -> None:
        row = self.current_row()
        if row is None:
            return
        QGuiApplication.clipboard().setText(copied_text(row))
        self._emit_for_current(self.copy_requested, "copy")

    @Slot(int, int)
    def copy_code(self, node_id: int, index: int) -> bool:
        """Put the exact code of `node_id`'s code block `index` on the clipboard and say
        "Copied"; False (nothing copied) when there is no such block."""
        number = self._chat_model.row_of(node_id)
        if number is None:
            return False
        row = self._chat_model.row_at(number)
        codes = self._delegate.code_of(row, self.viewport().width())
        if not 0 <= index < len(codes):
            return False
        QGuiApplication.clipboard().setText(codes[index])
        self._last_code_copy = (node_id, index)
        self._delegate.copied_button = (node_id, index)
        self._copied_timer.start()
        self.viewport().update(self.visualRect(self._chat_model.index(number, 0)))
        many = len(codes) > 1
        message = f"Copied code block {index + 1} of {len(codes)}" if many else "Copied"
        language = self._delegate.languages_of(row, self.viewport().width())[index]
        self.notice.emit(message, 4000)
        announce(self, f"{message}{f' ({language})' if language else ''}")
        log.debug("copied code block %s of node %s", index, node_id)
        return True

    @Slot()
    def _on_copy_code(self) -> None:
        """The current message's first code block; pressed again, the next one (round)."""
        row = self.current_row()
        if row is None or row.status == STREAMING:
            return
        count = len(self._delegate.code_of(row, self.viewport().width()))
        if count == 0:
            self.notice.emit("This message has no code block", 4000)
            return
        last = self._last_code_copy
        index = (last[1] + 1) % count if last is not None and last[0] == row.node_id else 0
        self.copy_code(row.node_id, index)

    @Slot(int)
    def toggle_reasoning(self, node_id: int) -> bool | None:
        """Fold or unfold `node_id`'s reasoning; whether it is shown now (None: the message
        is not shown or has no reasoning). Says so to a screen reader."""
        shown = self._chat_model.toggle_reasoning(node_id)
        number = self._chat_model.row_of(node_id)
        if shown is None or number is None:
            return None
        index = self._chat_model.index(number, 0)
        self._delegate.sizeHintChanged.emit(index)  # the row's height changes
        row = self._chat_model.row_at(number)
        split = reasoning_of(row)
        if row.role == TOOL:
            size = f", {lines_label(line_count(result_text(row.text)))}"
            announce(self, f"Result {'shown' if shown else 'collapsed'}{size}")
            return shown
        words = f", {split.words} words" if split is not None else ""
        announce(self, f"Reasoning {'shown' if shown else 'collapsed'}{words}")
        return shown

    @Slot()
    def _on_toggle_reasoning(self) -> None:
        row = self.current_row()
        if row is not None:
            self.toggle_reasoning(row.node_id)

    @Slot()
    def _on_copied_shown(self) -> None:
        self._delegate.copied_button = None
        self.viewport().update()

    @Slot(int)
    def _on_finished(self, node_id: int) -> None:
        """A reply that stops streaming is announced, with (the start of) its text."""
        number = self._chat_model.row_of(node_id)
        if number is None:
            return
        row = self._chat_model.row_at(number)
        if row.role != ASSISTANT:
            return
        split = reasoning_of(row)
        said = row.text if split is None or reasoning_shown(row, split) else split.answer
        text = " ".join(spoken_text(said).split())
        if not text and row.calls:  # a reply that only calls tools
            text = "; ".join(f"calls {spoken_call(call)}" for call in row.calls)
        if len(text) > ANNOUNCED_CHARS:
            text = text[:ANNOUNCED_CHARS - 1].rstrip() + "…"
        what = "Reply interrupted" if row.status == INTERRUPTED else "Reply finished"
        announce(self, f"{what}: {text}" if text else f"{what}.")

    @Slot()
    def _on_delete(self) -> None:
        self._emit_for_current(self.delete_requested, "delete")

    @Slot()
    def _on_previous_variant(self) -> None:
        self._step_variant(-1)

    @Slot()
    def _on_next_variant(self) -> None:
        self._step_variant(1)

    def _step_variant(self, step: int) -> None:
        row = self.current_row()
        if row is None:
            return
        wanted = row.variant + step
        if 0 <= wanted < row.variants:
            self.variant_requested.emit(row.node_id, wanted)

    # --- editing in place (the machinery: app.chat.chat_editing) ----------------------------

    @property
    def editing_node(self) -> int | None:
        """The node whose editor is open, or None."""
        return self._edits.node

    def editor(self) -> MessageEditor | None:
        """The open editor (the only widget among the messages), or None."""
        return self._edits.editor()

    def start_edit(self, node_id: int) -> bool:
        """Open the editor on `node_id`, prefilled with its text; another open edit is
        cancelled first (one at a time). False when the node is not shown."""
        return self._edits.start(node_id)

    @Slot()
    def cancel_edit(self) -> None:
        """Close the open editor, if any, and report the edit cancelled."""
        self._edits.cancel()

    def rowsAboutToBeRemoved(self, parent: ModelIndex, start: int, end: int) -> None:
        """The edited message going away closes its editor (reported once the rows are gone;
        Qt would otherwise drop the editor behind the view's back)."""
        self._edits.rows_about_to_be_removed(parent, start, end)
        super().rowsAboutToBeRemoved(parent, start, end)

    # --- menus and keys ----------------------------------------------------------------

    def context_menu(self) -> QMenu:
        """The menu of actions for the current message (the caller shows and deletes it)."""
        self.update_actions()
        menu = QMenu(self)
        row = self.current_row()
        menu.addAction(self.copy_action)
        if self.copy_code_action.isEnabled():
            menu.addAction(self.copy_code_action)
        if self._actions["toggle_reasoning"].isEnabled():
            menu.addAction(self._actions["toggle_reasoning"])
        menu.addAction(self.edit_action)
        if row is not None and row.role == ASSISTANT:
            menu.addAction(self.regenerate_action)
        if row is not None and row.variants > 1:
            menu.addSeparator()
            menu.addAction(self.previous_variant_action)
            menu.addAction(self.next_variant_action)
        menu.addSeparator()
        menu.addAction(self.rewind_action)
        menu.addAction(self.fork_action)
        menu.addSeparator()
        menu.addAction(self.delete_action)
        menu.setToolTipsVisible(True)
        return menu

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:
        """Right click on a message: make it current and offer its actions."""
        index = self.indexAt(event.pos())
        if not index.isValid():
            event.ignore()
            return
        self.setCurrentIndex(index)
        menu = self.context_menu()
        menu.exec(event.globalPos())
        menu.deleteLater()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Run an action's key even when no shortcut fired (say, the window is not active)."""
        pressed = QKeySequence(event.keyCombination())
        for action in self._actions.values():
            if any(
                seq.matches(pressed) == QKeySequence.SequenceMatch.ExactMatch
                for seq in action.shortcuts()
            ):
                if action.isEnabled():
                    action.trigger()
                event.accept()
                return
        super().keyPressEvent(event)

    def mouseDoubleClickEvent(self, event: QMouseEvent) -> None:
        """A double click on a user message (not on its version arrows) edits it."""
        pos = event.position().toPoint()
        index = self.indexAt(pos)
        row = MessageDelegate.row_from_index(index)
        if event.button() == Qt.MouseButton.LeftButton and row is not None and row.role == USER:
            rect = self.visualRect(index)
            controls = [*self._delegate.switcher_rects(rect, row),
                        *self._delegate.code_button_rects(rect, row)]
            if not any(control.contains(pos) for control in controls):
                self.start_edit(row.node_id)
                event.accept()
                return
        super().mouseDoubleClickEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        """A pointing hand over an enabled switcher arrow, a copy button (which lights up) or
        a reasoning's header."""
        pos = event.position().toPoint()
        index = self.indexAt(pos)
        row = MessageDelegate.row_from_index(index)
        rect = self.visualRect(index)
        button = self._delegate.code_button_at(rect, row, pos) if row is not None else None
        self._set_hovered_button(None if row is None or button is None
                                 else (row.node_id, button))
        over = button is not None or (row is not None and (
            self._delegate.arrow_at(rect, row, pos) != 0
            or self._delegate.reasoning_header_rect(rect, row).contains(pos)))
        if over:
            self.viewport().setCursor(Qt.CursorShape.PointingHandCursor)
        else:
            self.viewport().unsetCursor()
        super().mouseMoveEvent(event)

    def leaveEvent(self, event: QEvent) -> None:
        """No copy button stays lit once the pointer leaves."""
        self._set_hovered_button(None)
        super().leaveEvent(event)

    def _set_hovered_button(self, button: tuple[int, int] | None) -> None:
        before = self._delegate.hovered_button
        if before == button:
            return
        self._delegate.hovered_button = button
        for lit in (before, button):
            number = None if lit is None else self._chat_model.row_of(lit[0])
            if number is not None:
                self.viewport().update(self.visualRect(self._chat_model.index(number, 0)))

    # --- scrolling (following the end: app.chat.chat_scrolling) -----------------------------

    def scroll_to_node(
        self,
        node_id: int,
        hint: QAbstractItemView.ScrollHint = QAbstractItemView.ScrollHint.PositionAtTop,
    ) -> bool:
        """Scroll so that `node_id` shows (its top at the top by default)."""
        row = self._chat_model.row_of(node_id)
        if row is None:
            return False
        self.scrollTo(self._chat_model.index(row, 0), hint)
        return True

    @Slot()
    def _on_model_reset(self) -> None:
        # Another conversation: open it at its end (then an edit the reset closed reopens).
        self._at_bottom = True
        self._edits.on_model_reset()

    # --- other events ------------------------------------------------------------------

    def changeEvent(self, event: QEvent) -> None:
        """A new font changes every layout; a new palette (light/dark switch) changes the
        colours baked into the cached documents (links)."""
        if event.type() == QEvent.Type.FontChange:
            self._delegate.clear_cache()
            self.scheduleDelayedItemsLayout()
        elif event.type() == QEvent.Type.PaletteChange:
            self._delegate.clear_documents()
            self.viewport().update()
        super().changeEvent(event)
