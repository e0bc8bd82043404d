"""The delegate's half of editing a message in place: it hosts the one `MessageEditor`.

`EditingDelegate` makes the in-place `MessageEditor` (app.chat.message_editor) for the one message
being edited, prefills it once, places it and lets the row grow to the height the editor
wants (capped at `EDITOR_SHARE` of the view). It paints nothing: `MessageDelegate`
(app.chat.message_delegate) draws the bubble around the editor and tells this class where that
bubble's text goes through three hooks, `_row`, `_frame_height` and `_text_area`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from PySide6.QtCore import (
    QAbstractItemModel,
    QEvent,
    QObject,
    QPersistentModelIndex,
    QRect,
    Slot,
)
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QWidget,
)

from app.chat.chat_model import MessageRow, ModelIndex
from app.chat.message_editor import MessageEditor


@dataclass
class _Editing:
    """The delegate's note of the message being edited (at most one)."""

    node_id: int
    index: QPersistentModelIndex
    height: int  # what the editor wants, before the cap


class EditingDelegate(QStyledItemDelegate):
    """Makes and places the in-place `MessageEditor` for the one message being edited.

    The row of that message grows to the editor's wanted height (capped at `EDITOR_SHARE` of
    the view); a subclass paints the bubble around it and provides the three hooks.
    """

    EDITOR_SHARE: ClassVar[float] = 0.6  # an editor is at most this share of the view's height
    EDITOR_MIN_CAP: ClassVar[int] = 120  # ...but may always be this tall (a short view)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._edit: _Editing | None = None

    # --- hooks for the delegate that paints the bubbles ----------------------------------

    def _row(self, index: ModelIndex) -> MessageRow | None:
        """The message at `index`, or None."""
        raise NotImplementedError

    def _frame_height(self, font: QFont) -> int:
        """A bubble's height without its text: margins, padding and the header line."""
        raise NotImplementedError

    def _text_area(self, rect: QRect, row: MessageRow, font: QFont) -> QRect:
        """Where the text of `row`'s bubble, at its full width, goes in an item at `rect`."""
        raise NotImplementedError

    # --- editing in place --------------------------------------------------------------

    @property
    def editing_node(self) -> int | None:
        """The node whose editor this delegate made and has not destroyed yet, or None."""
        return None if self._edit is None else self._edit.node_id

    def _editing_height(self, option: QStyleOptionViewItem, wanted: int) -> int:
        """The edited row's height: the bubble's frame around the editor's (capped) height."""
        widget = option.widget
        view_height = widget.viewport().height() if isinstance(widget, QAbstractItemView) else 0
        cap = max(self.EDITOR_MIN_CAP, int(view_height * self.EDITOR_SHARE))
        return self._frame_height(QFont(option.font)) + min(wanted, cap)

    def createEditor(
        self, parent: QWidget, option: QStyleOptionViewItem, index: ModelIndex
    ) -> QWidget:
        """A `MessageEditor` that keeps the view's own keys (they act on whole messages)."""
        row = self._row(index)
        if row is None:
            return super().createEditor(parent, option, index)
        actions = option.widget.actions() if option.widget is not None else []
        keys = [seq for action in actions for seq in action.shortcuts()]
        editor = MessageEditor(parent, reserved_keys=keys)
        self._edit = _Editing(row.node_id, QPersistentModelIndex(index), editor.wanted_height())
        editor.height_wanted.connect(self._on_editor_height)
        return editor

    def setEditorData(self, editor: QWidget, index: ModelIndex) -> None:
        """Prefill a fresh editor with the message's text, and only a fresh one: the view
        calls this again whenever the row changes (a new version count, a checkpoint), which
        must not throw away what the user typed."""
        if not isinstance(editor, MessageEditor):
            super().setEditorData(editor, index)
            return
        row = self._row(index)
        if row is not None and not editor.filled:
            editor.set_text(row.text)

    def setModelData(self, editor: QWidget, model: QAbstractItemModel, index: ModelIndex) -> None:
        """Nothing: the model is read-only; the view reports the edit and its owner applies
        it to the tree."""

    def updateEditorGeometry(
        self, editor: QWidget, option: QStyleOptionViewItem, index: ModelIndex
    ) -> None:
        """Place the editor over the text area of a full-width bubble (the header stays)."""
        row = self._row(index)
        if row is None:
            super().updateEditorGeometry(editor, option, index)
            return
        editor.setGeometry(self._text_area(option.rect, row, QFont(option.font)))

    def destroyEditor(self, editor: QWidget, index: ModelIndex) -> None:
        """Forget the edit and let the row shrink back to its bubble."""
        if isinstance(editor, MessageEditor):
            editor.height_wanted.disconnect(self._on_editor_height)
            self._edit = None
            if index.isValid():
                self.sizeHintChanged.emit(index.model().index(index.row(), index.column()))
        super().destroyEditor(editor, index)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Leave a `MessageEditor` alone: by default a delegate commits and closes its editor
        when focus leaves it, which would throw away a long edit on a stray click."""
        if isinstance(watched, MessageEditor):
            return False
        return super().eventFilter(watched, event)

    @Slot(int)
    def _on_editor_height(self, height: int) -> None:
        edit = self._edit
        if edit is None or edit.height == height:
            return
        edit.height = height
        if edit.index.isValid():
            self.sizeHintChanged.emit(edit.index.model().index(edit.index.row(),
                                                               edit.index.column()))
