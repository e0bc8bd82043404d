"""The message composer: multi-line; Enter sends, Shift+Enter is a new line, Esc stops.

Files dropped on it or pasted into it are attachments, not text (`files_given`); with
documents attached, Enter sends even an empty message (`sendable_empty`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent, QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit


def local_files(mime: QMimeData) -> list[Path]:
    """The local files a drop or a paste carries (none: it carries text)."""
    if not mime.hasUrls():
        return []
    return [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile()]


class Composer(QPlainTextEdit):
    submitted = Signal(str)
    stop_requested = Signal()
    files_given = Signal(list)  # list[Path]: dropped or pasted files, to attach

    def __init__(self) -> None:
        super().__init__()
        self.setPlaceholderText("Write a message. Enter sends, Shift+Enter starts a new line.")
        self.setTabChangesFocus(True)
        self.setAcceptDrops(True)
        self.sendable_empty: Callable[[], bool] = lambda: False

    def keyPressEvent(self, event: QKeyEvent) -> None:
        key = event.key()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            text = self.toPlainText().strip()
            if text or self.sendable_empty():
                self.submitted.emit(text)
            event.accept()
            return
        if key == Qt.Key.Key_Escape:
            self.stop_requested.emit()
            event.accept()
            return
        super().keyPressEvent(event)

    # --- files: dropped or pasted, never inserted as their paths ----------------------------

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return bool(local_files(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        files = local_files(source)
        if files:
            self.files_given.emit(files)
            return
        super().insertFromMimeData(source)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if local_files(event.mimeData()):
            event.acceptProposedAction()
            return
        super().dragEnterEvent(event)

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:
        if local_files(event.mimeData()):
            event.acceptProposedAction()
            return
        super().dragMoveEvent(event)

    def dropEvent(self, event: QDropEvent) -> None:
        files = local_files(event.mimeData())
        if files:
            event.acceptProposedAction()
            self.files_given.emit(files)
            return
        super().dropEvent(event)
