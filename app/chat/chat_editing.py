"""Editing a message in place in the chat view: the one open `MessageEditor` and how it ends.

`ChatEditing` belongs to a `ChatView` (app.chat.chat_view). It opens the persistent editor that the
delegate makes over the bubble being edited (app.chat.editing_delegate), closes it, and follows
the rows so that every edit ends exactly once: each `started` is followed by one `submitted`
(the new text, stripped, when it is not blank and differs) or one `cancelled` (Esc, an
unchanged or blank text, another edit started, the message gone from the rows). A model reset
that keeps the message reopens its editor with what was typed. The view re-emits the three
signals as its own `edit_started`, `edit_submitted` and `edit_cancelled`.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QModelIndex, QObject, Signal, Slot
from PySide6.QtWidgets import QListView

from app.chat.chat_model import ChatModel, ModelIndex
from app.chat.message_editor import MessageEditor

log = logging.getLogger(__name__)


class ChatEditing(QObject):
    """The in-place edit of one message of `view`, whose rows are `model`'s (GUI thread)."""

    started = Signal(int)  # node id
    submitted = Signal(int, str)  # node id, the new text (stripped)
    cancelled = Signal(int)  # node id

    def __init__(self, view: QListView, model: ChatModel) -> None:
        super().__init__(view)
        self._view = view
        self._model = model
        self._editing: int | None = None  # the node whose editor is open
        self._lost_edit: int | None = None  # closed by a model change, cancelled once it ends
        self._kept_edit: tuple[str, bool] | None = None  # (text, focused) across a reset

    @property
    def node(self) -> int | None:
        """The node whose editor is open, or None."""
        return self._editing

    def editor(self) -> MessageEditor | None:
        """The open editor (the only widget among the messages), or None."""
        index = self._index_of(self._editing)
        widget = self._view.indexWidget(index) if index is not None else None
        return widget if isinstance(widget, MessageEditor) else None

    def start(self, node_id: int) -> bool:
        """Open the editor on `node_id`, prefilled with its text; another open edit is
        cancelled first (one at a time). False when the node is not shown."""
        index = self._index_of(node_id)
        if index is None:
            return False
        if node_id == self._editing:
            editor = self.editor()
            if editor is not None:
                editor.setFocus()
            return True
        self.cancel()
        self._view.setCurrentIndex(index)
        self._open_editor(node_id, None, focus=True)
        self._view.scrollTo(index)
        log.debug("editing node %s", node_id)
        self.started.emit(node_id)
        return True

    @Slot()
    def cancel(self) -> None:
        """Close the open editor, if any, and report the edit cancelled."""
        node = self._close_editor()
        if node is not None:
            log.debug("edit of node %s cancelled", node)
            self.cancelled.emit(node)

    def _index_of(self, node_id: int | None) -> QModelIndex | None:
        row = None if node_id is None else self._model.row_of(node_id)
        return None if row is None else self._model.index(row, 0)

    def _open_editor(self, node_id: int, text: str | None, *, focus: bool) -> None:
        index = self._index_of(node_id)
        if index is None:
            return
        self._editing = node_id
        self._view.openPersistentEditor(index)
        editor = self.editor()
        if editor is None:
            self._editing = None
            return
        if text is not None:
            editor.set_text(text)
        editor.submitted.connect(self._on_editor_submitted)
        editor.cancelled.connect(self.cancel)
        if focus:
            editor.setFocus()

    def _close_editor(self) -> int | None:
        """Close the open editor without a signal; returns its node id (None if none)."""
        node, self._editing = self._editing, None
        index = self._index_of(node)
        if index is not None:
            self._view.closePersistentEditor(index)
        return node

    @Slot(str)
    def _on_editor_submitted(self, text: str) -> None:
        node = self._editing
        index = self._index_of(node)
        if node is None or index is None:
            return
        original = self._model.row_at(index.row()).text
        new = text.strip()
        if not new or new == original.strip():
            self.cancel()
            return
        self._close_editor()  # first: the owner's new rows should find no editor open
        log.debug("edit of node %s submitted", node)
        self.submitted.emit(node, new)

    # --- following the rows (the view calls or connects these) ---------------------------

    def rows_about_to_be_removed(self, parent: ModelIndex, start: int, end: int) -> None:
        """The edited message going away closes its editor (reported by `on_rows_removed`,
        once the rows are gone; Qt would otherwise drop the editor behind the view's back)."""
        index = self._index_of(self._editing)
        if index is not None and not parent.isValid() and start <= index.row() <= end:
            self._lost_edit = self._close_editor()

    @Slot()
    def on_rows_removed(self) -> None:
        node, self._lost_edit = self._lost_edit, None
        if node is not None:
            self.cancelled.emit(node)

    @Slot()
    def on_model_about_to_reset(self) -> None:
        # A reset drops every editor: keep the text, to reopen it if the message stays.
        editor = self.editor()
        if editor is not None:
            self._kept_edit = (editor.text(), editor.text_edit.hasFocus())
        self._lost_edit = self._close_editor()

    def on_model_reset(self) -> None:
        """Reopen the editor the reset closed if its message is still shown, else cancel."""
        node, self._lost_edit = self._lost_edit, None
        kept, self._kept_edit = self._kept_edit, None
        if node is None:
            return
        if self._model.row_of(node) is not None and kept is not None:
            text, focused = kept
            self._open_editor(node, text, focus=focused)  # the same message: keep editing
        else:
            self.cancelled.emit(node)
