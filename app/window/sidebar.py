"""The conversations sidebar: newest first, full-text search, new / rename / delete."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QSize, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from engine.storage.store import ConversationInfo, SearchHit

ID_ROLE = Qt.ItemDataRole.UserRole


class _ViewportWide(QStyledItemDelegate):
    """Rows as wide as the list, whatever their text: a list view sizes a row to its text,
    so a long title made the list scroll sideways; at the list's width it is elided."""

    def sizeHint(self, option: QStyleOptionViewItem,
                 index: QModelIndex | QPersistentModelIndex) -> QSize:
        return QSize(0, super().sizeHint(option, index).height())


class Sidebar(QWidget):
    opened = Signal(int)
    new_requested = Signal()
    rename_requested = Signal(int)
    delete_requested = Signal(int)
    search_changed = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self.search = QLineEdit(placeholderText="Search all conversations")
        self.search.setClearButtonEnabled(True)
        self.list = QListWidget()
        self.list.setObjectName("conversations")
        self.list.setItemDelegate(_ViewportWide(self.list))
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.new_button = QPushButton("New")
        self.rename_button = QPushButton("Rename")
        self.delete_button = QPushButton("Delete")
        buttons = QHBoxLayout()
        for button in (self.new_button, self.rename_button, self.delete_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.search)
        layout.addWidget(self.list)
        layout.addLayout(buttons)
        self.list.currentItemChanged.connect(self._on_current)
        self.search.textChanged.connect(self.search_changed)
        self.new_button.clicked.connect(self.new_requested)
        self.rename_button.clicked.connect(self._on_rename)
        self.delete_button.clicked.connect(self._on_delete)
        self._generating: int | None = None
        self._quiet = False

    def show_conversations(self, conversations: list[ConversationInfo], current: int | None,
                           hits: list[SearchHit] | None = None) -> None:
        """Fill the list (newest first); with search hits, only the matching ones."""
        self._quiet = True
        self.list.clear()
        snippets = {h.conversation_id: h.snippet for h in hits} if hits is not None else None
        for info in conversations:
            if snippets is not None and info.id not in snippets:
                continue
            label = info.title + ("  ●" if info.id == self._generating else "")
            item = QListWidgetItem(label)
            item.setData(ID_ROLE, info.id)
            item.setToolTip(snippets[info.id] if snippets
                            else f"{info.title}\n{info.messages} messages")
            self.list.addItem(item)
            if info.id == current:
                self.list.setCurrentItem(item)
        self._quiet = False

    def set_generating(self, conversation_id: int | None) -> None:
        """Mark the conversation a reply is streaming into."""
        self._generating = conversation_id
        for row in range(self.list.count()):
            item = self.list.item(row)
            base = item.text().removesuffix("  ●")
            item.setText(base + ("  ●" if item.data(ID_ROLE) == conversation_id else ""))

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return int(item.data(ID_ROLE)) if item is not None else None

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_current(self, item: QListWidgetItem | None, _previous: object) -> None:
        if item is not None and not self._quiet:
            self.opened.emit(int(item.data(ID_ROLE)))

    @Slot()
    def _on_rename(self) -> None:
        current = self.current_id()
        if current is not None:
            self.rename_requested.emit(current)

    @Slot()
    def _on_delete(self) -> None:
        current = self.current_id()
        if current is not None:
            self.delete_requested.emit(current)
