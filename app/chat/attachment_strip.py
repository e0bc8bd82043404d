"""The documents waiting for the next message, above the composer: one button each (its
name and size; a click removes it), and the files still being read, with Cancel."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

from app.chat.chat_model import size_label
from app.look.icons import icon
from engine.core.attachments import Document


class AttachmentStrip(QWidget):
    removed = Signal(int)  # the index of the document the user took off
    cancel_requested = Signal()

    def __init__(self) -> None:
        super().__init__()
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(0, 0, 0, 0)
        self.buttons: list[QToolButton] = []
        self.reading_label = QLabel()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.setVisible(False)

    def show_state(self, documents: tuple[Document, ...], reading: tuple[str, ...]) -> None:
        while self._row.count():
            item = self._row.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None and widget not in (self.reading_label, self.cancel_button):
                widget.deleteLater()
        self.buttons = []
        for index, document in enumerate(documents):
            button = QToolButton()
            button.setText(f"{document.name} · {size_label(document.size)}  ✕")
            button.setIcon(icon("import"))
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            button.setToolTip(f"{document.name}: {len(document.text):,} characters of "
                              f"{document.kind.value}. Click to remove it.")
            button.setAccessibleName(f"Attached document {document.name}; remove")
            button.clicked.connect(lambda _checked=False, i=index: self.removed.emit(i))
            self._row.addWidget(button)
            self.buttons.append(button)
        if reading:
            self.reading_label.setText("Reading " + ", ".join(reading) + "…")
            self._row.addWidget(self.reading_label)
            self._row.addWidget(self.cancel_button)
        self.reading_label.setVisible(bool(reading))
        self.cancel_button.setVisible(bool(reading))
        self._row.addStretch(1)
        self.setVisible(bool(documents or reading))
