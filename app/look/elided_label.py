"""A one-line label that gives up width gracefully: it asks for its whole text's width, and
when the window is narrower it shows the text cut with "…" (the whole text in its tooltip)
instead of being clipped mid-letter or pushing its neighbours out of sight."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

MIN_CHARS = 12  # what it keeps at the least: enough to recognise the text


class ElidedLabel(QLabel):
    def __init__(self, text: str = "", parent: QWidget | None = None,
                 mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight) -> None:
        super().__init__(parent)
        self._full = ""
        self._mode = mode
        self._tip: str | None = None
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:
        self._full = text
        self._refresh()
        self.updateGeometry()

    def text(self) -> str:
        """The whole text (what callers set), whatever is shown."""
        return self._full

    def setToolTip(self, tip: str) -> None:
        """A tooltip of the caller's own; without one, the whole text when it is cut."""
        self._tip = tip or None
        self._refresh()

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        margins = self.contentsMargins()
        width = self.fontMetrics().horizontalAdvance(self._full) + margins.left() + \
            margins.right() + 2 * self.margin() + 2
        return QSize(width, hint.height())

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        least = self.fontMetrics().horizontalAdvance("x" * MIN_CHARS + "…")
        return QSize(min(least, self.sizeHint().width()), hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._refresh()

    def shown_text(self) -> str:
        """What is on screen now (the text, or its elided form)."""
        return QLabel.text(self)

    def _refresh(self) -> None:
        width = self.contentsRect().width() - 2 * self.margin()
        shown = self.fontMetrics().elidedText(self._full, self._mode, max(width, 0))
        if shown != QLabel.text(self):
            super().setText(shown)
        tip = self._tip if self._tip is not None else (self._full if shown != self._full
                                                       else "")
        QLabel.setToolTip(self, tip)
