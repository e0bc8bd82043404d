"""The chat view's in-place editor: a text box and a hint over the one bubble being edited.

Editing happens in place: the delegate creates a `MessageEditor` over the one bubble being
edited (a persistent editor, so the only widget in the list) and the row grows to fit it.
The model stays read-only; the view reports the new text with `edit_submitted`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

from PySide6.QtCore import QEvent, Qt, Signal, Slot
from PySide6.QtGui import QKeyEvent, QKeySequence, QPalette, QTextCursor
from PySide6.QtWidgets import QLabel, QLayout, QPlainTextEdit, QVBoxLayout, QWidget


def _is_enter(event: QKeyEvent) -> bool:
    return event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)


class _EditBox(QPlainTextEdit):
    """The editor's text box, with the composer's keys: Enter submits, Shift+Enter is a new
    line, Esc cancels.

    It keeps every key it is sent: the chat view's own keys (Delete, Ctrl+Backspace,
    Alt+Left...) act on whole messages, so one that slipped through from the box would delete
    a branch or switch versions while the user is only editing text. `reserved` lists those
    keys; the box claims them before any shortcut sees them.
    """

    submit = Signal()
    cancel = Signal()
    resized = Signal()

    def __init__(self, parent: QWidget, reserved: Sequence[QKeySequence]) -> None:
        super().__init__(parent)
        self._reserved = tuple(reserved)
        self.setTabChangesFocus(True)  # as in the composer

    def _claims(self, event: QKeyEvent) -> bool:
        if _is_enter(event) or event.key() == Qt.Key.Key_Escape:
            return True  # never the window's Stop (Esc) or any other window shortcut
        pressed = QKeySequence(event.keyCombination())
        return any(
            seq.matches(pressed) == QKeySequence.SequenceMatch.ExactMatch for seq in self._reserved
        )

    def event(self, event: QEvent) -> bool:
        """Claim the reserved keys, Enter and Esc before shortcuts fire."""
        if (
            event.type() == QEvent.Type.ShortcutOverride
            and isinstance(event, QKeyEvent)
            and self._claims(event)
        ):
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Enter submits, Shift+Enter is a new line, Esc cancels; no key reaches the view."""
        if _is_enter(event) and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submit.emit()
        elif event.key() == Qt.Key.Key_Escape:
            self.cancel.emit()
        else:
            super().keyPressEvent(event)
        event.accept()

    def resizeEvent(self, event: Any) -> None:
        """A new width wraps the text anew, which may change the height it needs."""
        super().resizeEvent(event)
        self.resized.emit()

    def content_height(self) -> int:
        """Pixels the wrapped text needs at the current width, frame included."""
        doc = self.document()
        height = doc.documentMargin()  # the first block's rect has the top margin already
        block = doc.begin()
        while block.isValid():
            height += self.blockBoundingRect(block).height()  # lays the block out if needed
            block = block.next()
        frame = self.contentsMargins()
        return math.ceil(height) + frame.top() + frame.bottom()


class MessageEditor(QWidget):
    """The in-place editor of one message: a multi-line text box and a hint line below it.

    Created by `MessageDelegate.createEditor` for the one message being edited. It reports
    the user's decision (`submitted` with the raw text, or `cancelled`) and the height it
    would like (`height_wanted`, the text plus a spare line and the hint); it never writes to
    the model. The font is the view's, inherited through the viewport.
    """

    submitted = Signal(str)
    cancelled = Signal()
    height_wanted = Signal(int)

    HINT: ClassVar[str] = "Enter to submit · Shift+Enter new line · Esc to cancel"
    SPACING: ClassVar[int] = 4

    def __init__(
        self, parent: QWidget | None = None, *, reserved_keys: Sequence[QKeySequence] = ()
    ) -> None:
        super().__init__(parent)
        self.setObjectName("chat_message_editor")
        self._box = _EditBox(self, reserved_keys)
        self._hint = QLabel(self.HINT, self)
        self._hint.setObjectName("chat_edit_hint")
        self._hint.setForegroundRole(QPalette.ColorRole.PlaceholderText)  # dim on any palette
        layout = QVBoxLayout(self)
        layout.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(self.SPACING)
        layout.addWidget(self._box, 1)
        layout.addWidget(self._hint)
        self.setFocusProxy(self._box)
        self._filled = False
        self._wanted = 0
        self._box.submit.connect(self._on_submit)
        self._box.cancel.connect(self.cancelled)
        self._box.textChanged.connect(self._update_height)
        self._box.resized.connect(self._update_height)

    @property
    def text_edit(self) -> QPlainTextEdit:
        """The text box (to type into, or to inspect)."""
        return self._box

    @property
    def filled(self) -> bool:
        """Whether the editor has been given its text (later row updates leave it alone)."""
        return self._filled

    def text(self) -> str:
        """The text as the user has it now, unstripped."""
        return self._box.toPlainText()

    def set_text(self, text: str) -> None:
        """Replace the text (a fresh undo history) and put the cursor at its end."""
        self._box.setPlainText(text)
        self._box.moveCursor(QTextCursor.MoveOperation.End)
        self._filled = True

    def wanted_height(self) -> int:
        """The text's height plus a spare line, then the hint: what the editor would like."""
        box = self._box.content_height() + self._box.fontMetrics().lineSpacing()
        return box + self.SPACING + self._hint.sizeHint().height()

    def changeEvent(self, event: QEvent) -> None:
        """Another font (the view's changed) means other line heights."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._update_height()

    @Slot()
    def _update_height(self) -> None:
        wanted = self.wanted_height()
        if wanted != self._wanted:
            self._wanted = wanted
            self.height_wanted.emit(wanted)

    @Slot()
    def _on_submit(self) -> None:
        self.submitted.emit(self.text())
