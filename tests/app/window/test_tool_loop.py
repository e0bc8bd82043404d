"""Tools of MCP servers in the window: a reply's call waits for the user's word (allow once,
always, deny, or Stop), runs on a real MCP server made by the tests
(tests/fixtures/mcp_server.py), and its result is a tool node the model answers. The window's
handling runs on the scripted fake engine; the whole loop once more on a real model (a tiny
one whose template takes tools, its call forced by "call a tool first")."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.chat.chat_model import reasoning_label, reasoning_of, rows_from_tree
from app.state.tool_calls import DENIED, MAX_AUTOMATIC_ROUNDS
from app.window.main_window import MainWindow
from engine.config.mcp import McpServer
from engine.config.overrides import Overrides
from engine.config.settings import load_settings
from engine.core.tools import TOOL_CALL_ID, ToolCall, calls_of
from engine.core.tree import NodeStatus, Role
from tests.app_fixtures import TIMEOUT, destroy, open_window, send
from tests.fake_engine import Script

SERVER = Path(__file__).parents[2] / "fixtures" / "mcp_server.py"
TEST_SERVER = McpServer("test", command=sys.executable, args=(str(SERVER),), timeout_s=60)


def _offer(win: MainWindow, *names: str) -> None:
    """Settings hold the test server, and the conversation offers these of its tools."""
    win.models.apply_settings(replace(win.settings, mcp_servers=(TEST_SERVER,)))
    listed = win.controller.tools.hub.list_tools("test").result(TIMEOUT / 1000)
    tools = [t.to_openai() for t in listed if t.name in names]
    assert len(tools) == len(names)
    assert win.controller.set_tools(tools, {name: "test" for name in names})


def _ask(qtbot: QtBot, win: MainWindow, text: str) -> None:
    """Send a message whose reply calls tools; the first call asks as the reply ends."""
    asked: list[object] = []
    win.controller.tools.asking.connect(asked.append)
    send(qtbot, win, text)
    win.controller.tools.asking.disconnect(asked.append)
    last = win.controller.tree.messages()[-1]
    assert asked and asked[-1] is not None, (last.text, last.meta)
    assert win.approval.isVisible()


def test_a_call_asks_first_runs_on_the_server_and_is_answered(
        qtbot: QtBot, fake_window: MainWindow, fake_engine: Script) -> None:
    win = fake_window
    _offer(win, "add")
    call = ToolCall.new("add", {"a": 2, "b": 3})
    fake_engine.calls = [call]
    _ask(qtbot, win, "What is 2 + 3?")
    assert "add (test)" in win.approval.label.text()
    assert '{"a": 2, "b": 3}' in win.approval.label.text()
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        qtbot.mouseClick(win.approval.allow_once, Qt.MouseButton.LeftButton)
    tree = win.controller.tree
    _user, reply, result, answer = tree.messages()
    assert calls_of(reply.meta) == (call,)
    assert (result.role, result.text, result.meta[TOOL_CALL_ID]) == (Role.TOOL, "5", call.id)
    assert (answer.role, answer.text, answer.status) == (
        Role.ASSISTANT, "You said: 5", NodeStatus.COMPLETE)
    assert not win.approval.isVisible()
    saved = win.store.load(win.controller.current or 0)
    assert [n.text for n in saved.messages()] == [n.text for n in tree.messages()]
    # The chat shows the result folded under a header naming the call.
    row = rows_from_tree(tree)[2]
    assert row.role == "tool" and row.call == 'add({"a": 2, "b": 3})'
    assert reasoning_label(row, reasoning_of(row)) == 'add({"a": 2, "b": 3}) · 1 line'  # type: ignore[arg-type]


def test_a_denied_call_is_a_result_the_model_reads(
        qtbot: QtBot, fake_window: MainWindow, fake_engine: Script) -> None:
    win = fake_window
    _offer(win, "add")
    fake_engine.calls = [ToolCall.new("add", {"a": 1, "b": 1})]
    _ask(qtbot, win, "1 + 1?")
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        qtbot.mouseClick(win.approval.deny, Qt.MouseButton.LeftButton)
    *_, result, answer = win.controller.tree.messages()
    assert result.text == DENIED and answer.text == f"You said: {DENIED}"


def test_stop_ends_the_loop_and_leaves_the_call_unanswered(
        qtbot: QtBot, fake_window: MainWindow, fake_engine: Script) -> None:
    win = fake_window
    _offer(win, "add")
    fake_engine.calls = [ToolCall.new("add", {"a": 1, "b": 2})]
    _ask(qtbot, win, "1 + 2?")
    qtbot.keyClick(win.composer, Qt.Key.Key_Escape)
    assert not win.approval.isVisible() and not win.controller.tools.busy
    last = win.controller.tree.messages()[-1]
    assert last.role is Role.ASSISTANT and calls_of(last.meta)
    send(qtbot, win, "never mind")  # the window goes on as usual
    assert win.controller.tree.messages()[-1].text == "You said: never mind"


def test_always_allow_is_saved_and_runs_without_asking_until_the_round_limit(
        qtbot: QtBot, fake_window: MainWindow, fake_engine: Script) -> None:
    win = fake_window
    _offer(win, "add")
    fake_engine.calls = [ToolCall.new("add", {"a": 20, "b": 22})]
    _ask(qtbot, win, "20 + 22?")
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        qtbot.mouseClick(win.approval.allow_always, Qt.MouseButton.LeftButton)
    assert win.controller.tree.messages()[-2].text == "42"
    assert load_settings().settings.mcp_servers[0].always_allowed == ("add",)
    assert win.settings.mcp_servers[0].always_allowed == ("add",)

    # A model that calls again after every result: the calls run by themselves, and after
    # MAX_AUTOMATIC_ROUNDS rounds the next one asks.
    def calling_again(text: str, _seed: int) -> str:
        fake_engine.calls = [ToolCall.new("add", {"a": 1, "b": 1})]
        return "again"

    fake_engine.reply = calling_again
    with qtbot.waitSignal(win.controller.tools.asking, timeout=TIMEOUT):
        send(qtbot, win, "keep adding")
    path = win.controller.tree.messages()
    since = max(i for i, n in enumerate(path) if n.role is Role.USER)
    assert sum(1 for n in path[since:] if n.role is Role.TOOL) == MAX_AUTOMATIC_ROUNDS
    qtbot.keyClick(win.composer, Qt.Key.Key_Escape)
    assert not win.controller.tools.busy


def test_a_failing_tool_and_a_tool_no_server_offers_are_results_too(
        qtbot: QtBot, fake_window: MainWindow, fake_engine: Script) -> None:
    win = fake_window
    _offer(win, "fail")
    fake_engine.calls = [ToolCall.new("fail", {"why": "broken on purpose"}),
                         ToolCall.new("gone", {})]
    _ask(qtbot, win, "try it")
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        qtbot.mouseClick(win.approval.allow_once, Qt.MouseButton.LeftButton)
    *_, reply, failed, missing, answer = win.controller.tree.messages()
    assert len(calls_of(reply.meta)) == 2
    assert failed.role is Role.TOOL and "fail" in failed.text
    assert missing.role is Role.TOOL and "offers the tool gone" in missing.text
    assert answer.parent == missing.id


@pytest.fixture
def tool_window(qtbot: QtBot, tmp_path: Path, tool_models: dict[str, Path]
                ) -> Iterator[MainWindow]:
    """The window (engine process) on the tiny dense model whose template takes tools."""
    win = open_window(qtbot, tmp_path, tool_models["dense"])
    yield win
    win.close()
    destroy(win)


@pytest.mark.engine_process
def test_the_loop_on_a_real_model_and_an_edited_result_decodes_only_the_tail(
        qtbot: QtBot, tool_window: MainWindow) -> None:
    win = tool_window
    _offer(win, "add")
    assert win.controller.set_overrides(Overrides(temperature=0.0, max_tokens=200,
                                                  tool_first=True))
    _ask(qtbot, win, "What is 2 + 3?")
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        qtbot.mouseClick(win.approval.allow_once, Qt.MouseButton.LeftButton)
    tree = win.controller.tree
    _user, reply, result, answer = tree.messages()[:4]
    (call,) = calls_of(reply.meta)  # forced: a call of `add` the grammar made valid
    arguments = json.loads(call.arguments)
    assert call.name == "add" and result.text == str(arguments["a"] + arguments["b"])
    assert answer.role is Role.ASSISTANT and answer.status is NodeStatus.COMPLETE
    assert answer.tokens

    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        win.controller.edit(result.id, "41")
    report = win.replies.last_reply
    assert report is not None and report.reused_tokens > 0
    assert report.decoded_tokens < report.prompt_tokens // 2  # the tail, not the path
    *_, edited, again = tree.messages()
    assert (edited.role, edited.text, edited.parent) == (Role.TOOL, "41", reply.id)
    assert again.parent == edited.id and again.status is NodeStatus.COMPLETE
