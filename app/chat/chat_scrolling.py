"""How the chat view scrolls: it keeps to the end while a reply grows, and never jumps.

`TailFollowingView` is the `QListView` that `ChatView` (app.chat.chat_view) is built on. While the
user is at the end of the list (within `BOTTOM_SLACK` pixels), the view stays at the end as the
last message grows (a streaming reply), unless `follow_tail` is off; scrolling up stops
following and `scroll_to_end` starts again. A message taller than the view that is already
partly visible does not jump to its top when it becomes current.
"""

from __future__ import annotations

from typing import ClassVar

from PySide6.QtCore import Slot
from PySide6.QtWidgets import QAbstractItemView, QListView, QWidget

from app.chat.chat_model import ModelIndex


class TailFollowingView(QListView):
    """A list view that follows its tail while the user is there (GUI thread only)."""

    BOTTOM_SLACK: ClassVar[int] = 4  # pixels from the end that still count as "at the bottom"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._follow_tail = True
        self._at_bottom = True
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scroll_value)
        bar.rangeChanged.connect(self._on_scroll_range)

    @property
    def follow_tail(self) -> bool:
        """Whether the view stays at the bottom while the last message grows (when the user
        was already at the bottom)."""
        return self._follow_tail

    @follow_tail.setter
    def follow_tail(self, enabled: bool) -> None:
        self._follow_tail = bool(enabled)

    def is_at_bottom(self) -> bool:
        """Whether the view shows the end of the conversation."""
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - self.BOTTOM_SLACK

    @Slot()
    def scroll_to_end(self) -> None:
        """Show the end of the conversation and follow it again."""
        self.doItemsLayout()
        self.scrollToBottom()
        self._at_bottom = True

    def scrollTo(
        self,
        index: ModelIndex,
        hint: QAbstractItemView.ScrollHint = QAbstractItemView.ScrollHint.EnsureVisible,
    ) -> None:
        """As QListView, but a message taller than the view that is already partly visible
        does not jump to its top when clicked."""
        if hint == QAbstractItemView.ScrollHint.EnsureVisible and index.isValid():
            rect = self.visualRect(index)
            area = self.viewport().rect()
            if rect.height() > area.height() and rect.intersects(area):
                return
        super().scrollTo(index, hint)

    @Slot(int)
    def _on_scroll_value(self, _value: int) -> None:
        self._at_bottom = self.is_at_bottom()

    @Slot(int, int)
    def _on_scroll_range(self, _minimum: int, maximum: int) -> None:
        if self._follow_tail and self._at_bottom:
            self.verticalScrollBar().setValue(maximum)
