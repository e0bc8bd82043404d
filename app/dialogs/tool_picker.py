"""Which tools of the user's MCP servers a conversation offers the model: a checkable list,
server by server, filled as each server answers (listing runs off the GUI thread, in
engine.mcp.hub). A tool the conversation offers already stays offered, with the schema it was
saved with, even while its server cannot be reached; two tools of one name cannot both be
offered (the model calls tools by name)."""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import QLabel, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from engine.config.mcp import McpServer
from engine.core.errors import printable
from engine.mcp.hub import McpHub, McpTool

_TOOL = Qt.ItemDataRole.UserRole + 1  # a tool item's McpTool


class ToolPicker(QWidget):
    listed = Signal(str, object)  # a server's name and its tools (or the error), any thread

    def __init__(self, hub: McpHub, servers: Sequence[McpServer],
                 offered: Sequence[Mapping[str, Any]], offered_servers: Mapping[str, str],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.hub = hub
        self.tree = QTreeWidget()
        self.tree.setHeaderHidden(True)
        self.tree.setAccessibleName("Tools offered to the model")
        self.tree.setMinimumHeight(140)
        self.note = QLabel()
        self.note.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.tree)
        layout.addWidget(self.note)
        self._servers: dict[str, QTreeWidgetItem] = {}
        by_name = {str(t["function"]["name"]): t for t in offered}
        self.listed.connect(self._on_listed)
        enabled = [s for s in servers if s.enabled]
        if not enabled:
            self.note.setText("No MCP servers yet: add them in Settings → Tools.")
        for server in enabled:
            item = QTreeWidgetItem(self.tree, [f"{server.name} · listing its tools…"])
            item.setFlags(Qt.ItemFlag.ItemIsEnabled)
            item.setExpanded(True)
            self._servers[server.name] = item
            # What is offered already shows at once, checked, until the server answers.
            for name, tool in by_name.items():
                if offered_servers.get(name) == server.name:
                    function = tool["function"]
                    self._add(item, McpTool(server.name, name,
                                            str(function.get("description") or ""),
                                            function.get("parameters") or {}), True)
            hub.list_tools(server.name).add_done_callback(self._relay(server.name))
        self.tree.itemChanged.connect(self._on_changed)

    def _relay(self, server: str) -> Callable[[concurrent.futures.Future[list[McpTool]]], None]:
        """Hands a listing to the GUI thread (the hub calls this on its own)."""
        def relay(done: concurrent.futures.Future[list[McpTool]]) -> None:
            with contextlib.suppress(RuntimeError):  # the dialog was closed meanwhile
                self.listed.emit(server, _listing(done))

        return relay

    def _add(self, parent: QTreeWidgetItem, tool: McpTool, checked: bool) -> QTreeWidgetItem:
        item = QTreeWidgetItem(parent, [tool.name])
        item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(0, Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
        item.setData(0, _TOOL, tool)
        item.setToolTip(0, tool.description or tool.name)
        return item

    @Slot(str, object)
    def _on_listed(self, server: str, listing: list[McpTool] | str) -> None:
        parent = self._servers.get(server)
        if parent is None:
            return
        self.tree.blockSignals(True)
        try:
            if isinstance(listing, str):
                parent.setText(0, f"{server} · could not be listed: {listing}")
                return
            checked = {child.text(0) for child in _children(parent)}
            parent.takeChildren()
            for tool in listing:
                self._add(parent, tool, tool.name in checked)
            count = "1 tool" if len(listing) == 1 else f"{len(listing)} tools"
            parent.setText(0, f"{server} · {count}")
            gone = checked - {t.name for t in listing}
            if gone:
                self.note.setText(f"{server} no longer offers {', '.join(sorted(gone))}: "
                                  f"no longer offered to the model either.")
        finally:
            self.tree.blockSignals(False)

    @Slot(QTreeWidgetItem, int)
    def _on_changed(self, item: QTreeWidgetItem, _column: int) -> None:
        if item.checkState(0) is not Qt.CheckState.Checked:
            return
        for other in self._checked():
            if other is not item and other.text(0) == item.text(0):
                self.tree.blockSignals(True)
                item.setCheckState(0, Qt.CheckState.Unchecked)
                self.tree.blockSignals(False)
                self.note.setText(f"Another server's {item.text(0)} is offered already: the "
                                  f"model calls tools by name, so only one can be.")
                return

    def _checked(self) -> list[QTreeWidgetItem]:
        return [child for parent in self._servers.values() for child in _children(parent)
                if child.checkState(0) is Qt.CheckState.Checked]

    def chosen(self) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The tools to offer (OpenAI's shape) and the server of each, by name."""
        tools: list[dict[str, Any]] = []
        servers: dict[str, str] = {}
        for item in self._checked():
            tool: McpTool = item.data(0, _TOOL)
            tools.append(tool.to_openai())
            servers[tool.name] = tool.server
        return tools, servers

    def check(self, server: str, tool: str) -> bool:
        """Check a tool by name (the tests' and keyboard users' way); False when not listed."""
        parent = self._servers.get(server)
        for child in _children(parent) if parent is not None else []:
            if child.text(0) == tool:
                child.setCheckState(0, Qt.CheckState.Checked)
                return True
        return False


def _children(parent: QTreeWidgetItem) -> list[QTreeWidgetItem]:
    return [c for c in (parent.child(i) for i in range(parent.childCount())) if c is not None]


def _listing(done: concurrent.futures.Future[list[McpTool]]) -> list[McpTool] | str:
    try:
        return done.result()
    except Exception as exc:
        return printable(str(exc), 200)
