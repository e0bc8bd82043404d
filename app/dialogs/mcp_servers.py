"""Settings → Tools: the MCP servers whose tools conversations may offer the model.

A server is a command Arbor starts (stdio: program, arguments, extra environment) or a URL
(streamable HTTP, with extra headers such as an Authorization). Each has a call timeout and a
list of tools allowed to run without asking, which the user can take back here. Which tools a
conversation offers is chosen in its Conversation settings (app.dialogs.tool_picker).
"""

from __future__ import annotations

import shlex

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.config.mcp import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, McpServer, Transport


class McpServerDialog(QDialog):
    """One server's definition; OK only while it is one Arbor can use."""

    def __init__(self, server: McpServer | None, taken: set[str],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("MCP server")
        self._taken = {name.casefold() for name in taken}
        server = server or McpServer("")
        self.name = QLineEdit(server.name)
        self.name.setPlaceholderText("files, search, …")
        self.transport = QComboBox()
        for transport in Transport:
            self.transport.addItem(transport.label, transport)
        self.transport.setCurrentIndex(list(Transport).index(server.transport))
        self.command = QLineEdit(shlex.join([server.command, *server.args])
                                 if server.command else "")
        self.command.setPlaceholderText("npx -y @modelcontextprotocol/server-filesystem ~/notes")
        self.env = QPlainTextEdit("\n".join(f"{k}={v}" for k, v in server.env.items()))
        self.env.setPlaceholderText("NAME=value, one per line")
        self.url = QLineEdit(server.url)
        self.url.setPlaceholderText("http://127.0.0.1:8000/mcp")
        self.headers = QPlainTextEdit("\n".join(f"{k}: {v}" for k, v in server.headers.items()))
        self.headers.setPlaceholderText("Authorization: Bearer …, one per line")
        for edit in (self.env, self.headers):
            edit.setMaximumHeight(70)
            edit.setTabChangesFocus(True)
        self.timeout = QSpinBox(minimum=1, maximum=MAX_TIMEOUT_S, suffix=" s")
        self.timeout.setValue(server.timeout_s or DEFAULT_TIMEOUT_S)
        self.enabled = QCheckBox("On")
        self.enabled.setChecked(server.enabled)
        self.allowed = QLineEdit(", ".join(server.always_allowed))
        self.allowed.setPlaceholderText("none: every call asks first")
        self.allowed.setToolTip("Tools of this server that run without asking (\"Always "
                                "allow\"); remove a name to be asked again.")
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Reached by", self.transport)
        form.addRow("Command", self.command)
        form.addRow("Environment", self.env)
        form.addRow("URL", self.url)
        form.addRow("Headers", self.headers)
        form.addRow("A call may take", self.timeout)
        form.addRow("Server", self.enabled)
        form.addRow("Always allowed", self.allowed)
        self.form = form
        self.problem = QLabel(wordWrap=True)
        note = QLabel("Headers and environment values are kept in the settings file in plain "
                      "text, as the API key is; Arbor never logs them.", wordWrap=True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        column = QVBoxLayout(self)
        column.addLayout(form)
        column.addWidget(note)
        column.addWidget(self.problem)
        column.addWidget(self.buttons)
        for line in (self.name, self.command, self.url, self.allowed):
            line.textChanged.connect(self._update)
        for text in (self.env, self.headers):
            text.textChanged.connect(self._update)
        self.transport.currentIndexChanged.connect(self._update)
        self._update()

    def chosen(self) -> McpServer:
        """The server as edited; ValueError saying what is wrong with it."""
        transport = Transport(self.transport.currentData())
        words: list[str] = []
        if transport is Transport.STDIO:
            try:
                words = shlex.split(self.command.text())
            except ValueError as exc:
                raise ValueError(f"the command cannot be read: {exc}") from None
        server = McpServer(
            self.name.text().strip(), transport,
            command=words[0] if words else "", args=tuple(words[1:]),
            env=_pairs(self.env.toPlainText(), "=") if transport is Transport.STDIO else {},
            url=self.url.text().strip() if transport is Transport.HTTP else "",
            headers=(_pairs(self.headers.toPlainText(), ":")
                     if transport is Transport.HTTP else {}),
            timeout_s=self.timeout.value(), enabled=self.enabled.isChecked(),
            always_allowed=tuple(dict.fromkeys(
                t.strip() for t in self.allowed.text().split(",") if t.strip())))
        problems = server.problems()
        if server.name.casefold() in self._taken:
            problems.append(f"another server is called {server.name}")
        if problems:
            raise ValueError("; ".join(problems))
        return server

    def _update(self) -> None:
        stdio = Transport(self.transport.currentData()) is Transport.STDIO
        for widget, shown in ((self.command, stdio), (self.env, stdio),
                              (self.url, not stdio), (self.headers, not stdio)):
            self.form.setRowVisible(widget, shown)
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        try:
            self.chosen()
        except ValueError as exc:
            self.problem.setText(f"Cannot use it yet: {exc}.")
            ok.setEnabled(False)
            return
        self.problem.setText("")
        ok.setEnabled(True)


def _pairs(text: str, separator: str) -> dict[str, str]:
    """`NAME=value` (or `Name: value`) lines; ValueError naming a line without one."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, found, value = line.partition(separator)
        if not found or not name.strip():
            raise ValueError(f"{line.strip()[:40]!r} is not name{separator}value")
        out[name.strip()] = value.strip()
    return out


class McpServersBox(QGroupBox):
    """The list of servers in Settings, with Add, Edit and Remove."""

    changed = Signal()

    def __init__(self, servers: tuple[McpServer, ...], parent: QWidget | None = None) -> None:
        super().__init__("Tools: MCP servers", parent)
        self.servers = list(servers)
        self.list = QListWidget()
        self.list.setAccessibleName("MCP servers")
        self.add = QPushButton("Add…")
        self.edit = QPushButton("Edit…")
        self.remove = QPushButton("Remove")
        self.add.clicked.connect(lambda: self._open(None))
        self.edit.clicked.connect(lambda: self._open(self.list.currentRow()))
        self.list.itemDoubleClicked.connect(lambda _item: self._open(self.list.currentRow()))
        self.remove.clicked.connect(self._remove)
        buttons = QHBoxLayout()
        for button in (self.add, self.edit, self.remove):
            buttons.addWidget(button)
        buttons.addStretch(1)
        note = QLabel("Conversations offer their tools to the model: choose which in "
                      "Conversation settings. Nothing runs without your approval.",
                      wordWrap=True)
        column = QVBoxLayout(self)
        column.addWidget(self.list)
        column.addLayout(buttons)
        column.addWidget(note)
        self.list.currentRowChanged.connect(self._selection)
        self._fill()

    def _fill(self) -> None:
        self.list.clear()
        for server in self.servers:
            where = (shlex.join([server.command, *server.args])
                     if server.transport is Transport.STDIO else server.url)
            state = "" if server.enabled else " (off)"
            self.list.addItem(f"{server.name}{state} · {where}")
        self._selection()

    def _selection(self) -> None:
        chosen = self.list.currentRow() >= 0
        self.edit.setEnabled(chosen)
        self.remove.setEnabled(chosen)

    def _open(self, row: int | None) -> None:
        current = self.servers[row] if row is not None and row >= 0 else None
        taken = {s.name for s in self.servers if s is not current}
        dialog = McpServerDialog(current, taken, self)
        dialog.accepted.connect(lambda: self.put(row, dialog.chosen()))
        dialog.open()

    def put(self, row: int | None, server: McpServer) -> None:
        """A server added (row None) or edited."""
        if row is None or row < 0:
            self.servers.append(server)
        else:
            self.servers[row] = server
        self._fill()
        self.changed.emit()

    def _remove(self) -> None:
        row = self.list.currentRow()
        if row >= 0:
            del self.servers[row]
            self._fill()
            self.changed.emit()
