"""The status bar, with its passing message cut with "…" where the permanent widgets begin.

QStatusBar draws the message clipped at the first permanent widget, mid-letter ("…41 of 45
tokens reu|checkpoints: 3" at 1400 px). This one paints as QStatusBar does (the panel, the
permanent widgets' frames) but elides the message to the room it has, and puts the whole
message in the bar's tooltip when it had to cut it. `currentMessage()` is unchanged.
"""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QStatusBar, QStyle, QStyleOption, QWidget

MESSAGE_LEFT = 6  # where QStatusBar starts its message
GAP = 8  # between the message's last letter and the first permanent widget


class MessageBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._permanent: list[QWidget] = []
        self.shown_message = ""  # the message as painted (elided), for tests
        self.messageChanged.connect(lambda _text: self.update())

    def addPermanentWidget(self, widget: QWidget, stretch: int | None = 0) -> None:
        self._permanent.append(widget)
        super().addPermanentWidget(widget, stretch or 0)

    def insertPermanentWidget(self, index: int, widget: QWidget,
                              stretch: int | None = 0) -> int:
        self._permanent.append(widget)
        return super().insertPermanentWidget(index, widget, stretch or 0)

    def message_rect(self) -> QRect:
        """Where the message may be painted: up to the leftmost visible permanent widget."""
        right = self.width() - 12
        for widget in self._permanent:
            if widget.isVisible():
                right = min(right, widget.x() - GAP)
        return QRect(MESSAGE_LEFT, 0, max(0, right - MESSAGE_LEFT), self.height())

    def paintEvent(self, event: QPaintEvent) -> None:
        message = self.currentMessage()
        if not message:
            self.shown_message = ""
            super().paintEvent(event)
            return
        painter = QPainter(self)
        option = QStyleOption()
        option.initFrom(self)
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_PanelStatusBar, option, painter,
                                   self)
        for widget in self._permanent:
            if widget.isVisible():
                frame = QStyleOption()
                frame.rect = widget.geometry().adjusted(-2, -1, 2, 1)
                frame.palette = self.palette()
                self.style().drawPrimitive(QStyle.PrimitiveElement.PE_FrameStatusBarItem, frame,
                                           painter, widget)
        rect = self.message_rect()
        shown = self.fontMetrics().elidedText(message, Qt.TextElideMode.ElideRight,
                                              rect.width())
        self.shown_message = shown
        self.setToolTip(message if shown != message else "")
        painter.setPen(self.palette().windowText().color())
        painter.drawText(rect, Qt.AlignmentFlag.AlignLeading | Qt.AlignmentFlag.AlignVCenter
                         | Qt.TextFlag.TextSingleLine, shown)
        painter.end()
