"""Settings → Tools (the MCP servers) and the tools a conversation offers, in their dialogs;
the listing comes from a real MCP server made by the tests (tests/fixtures/mcp_server.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QDialogButtonBox
from pytestqt.qtbot import QtBot

from app.dialogs.conversation_settings import ConversationSettingsDialog
from app.dialogs.mcp_servers import McpServerDialog
from app.dialogs.settings_dialog import SettingsDialog
from app.dialogs.tool_picker import ToolPicker
from engine.config.mcp import McpServer, Transport
from engine.config.overrides import Overrides
from engine.config.settings import Settings
from engine.mcp.hub import McpHub

SERVER = Path(__file__).parents[2] / "fixtures" / "mcp_server.py"
WAIT_MS = 120_000


def _server(name: str) -> McpServer:
    return McpServer(name, command=sys.executable, args=(str(SERVER),))


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[McpHub]:
    made = McpHub([_server("one"), _server("two")], log_dir=tmp_path)
    yield made
    made.close()


def test_a_server_is_accepted_only_once_it_can_be_used(qtbot: QtBot) -> None:
    dialog = McpServerDialog(None, {"files"})
    qtbot.addWidget(dialog)
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert not ok.isEnabled()
    dialog.name.setText("files")
    dialog.command.setText("npx -y '@x/server files' /tmp")
    assert not ok.isEnabled() and "another server" in dialog.problem.text()
    dialog.name.setText("notes")
    dialog.env.setPlainText("TOKEN=abc\nnot a pair")
    assert not ok.isEnabled() and "name=value" in dialog.problem.text()
    dialog.env.setPlainText("TOKEN=abc")
    assert ok.isEnabled()
    chosen = dialog.chosen()
    assert (chosen.command, chosen.args, dict(chosen.env)) == (
        "npx", ("-y", "@x/server files", "/tmp"), {"TOKEN": "abc"})
    dialog.transport.setCurrentIndex(list(Transport).index(Transport.HTTP))
    dialog.url.setText("https://example.com/mcp")
    dialog.headers.setPlainText("Authorization: Bearer k")
    web = dialog.chosen()
    assert (web.url, dict(web.headers), web.command) == (
        "https://example.com/mcp", {"Authorization": "Bearer k"}, "")


def test_the_settings_dialog_keeps_the_servers_added_and_removed(qtbot: QtBot) -> None:
    dialog = SettingsDialog(Settings(mcp_servers=(_server("one"),)))
    qtbot.addWidget(dialog)
    dialog.mcp.put(None, _server("two"))
    assert [s.name for s in dialog.chosen().mcp_servers] == ["one", "two"]
    dialog.mcp.list.setCurrentRow(0)
    dialog.mcp.remove.click()
    assert [s.name for s in dialog.chosen().mcp_servers] == ["two"]


def test_the_picker_lists_each_server_and_offers_one_tool_per_name(
        qtbot: QtBot, hub: McpHub) -> None:
    picker = ToolPicker(hub, hub.servers, [], {})
    qtbot.addWidget(picker)
    for server in ("one", "two"):
        qtbot.waitUntil(lambda s=server: picker.check(s, "add"), timeout=WAIT_MS)
    tools, servers = picker.chosen()
    assert [t["function"]["name"] for t in tools] == ["add"] and servers == {"add": "one"}
    assert "only one can be" in picker.note.text()
    assert tools[0]["function"]["parameters"]["required"] == ["a", "b"]


def test_offered_tools_stay_while_their_server_cannot_be_reached(
        qtbot: QtBot, tmp_path: Path) -> None:
    broken = McpServer("gone", command=str(tmp_path / "missing"), timeout_s=20)
    hub = McpHub([broken], log_dir=tmp_path)
    try:
        offered = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
        dialog = ConversationSettingsDialog(
            Overrides(tool_first=True), Settings(), None,
            tools=ToolPicker(hub, [broken], offered, {"lookup": "gone"}))
        qtbot.addWidget(dialog)
        assert dialog.tool_first.isChecked() and dialog.chosen().tool_first
        assert dialog.tools is not None
        qtbot.waitUntil(lambda: "could not be listed" in dialog.tools.tree.topLevelItem(0)
                        .text(0), timeout=WAIT_MS)
        tools, servers = dialog.tools.chosen()
        assert tools[0]["function"]["name"] == "lookup" and servers == {"lookup": "gone"}
    finally:
        hub.close()
