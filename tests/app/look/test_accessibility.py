"""The painted parts for keyboards and screen readers: what the chat's rows say, announcements
of finished replies, version switches and copies by key, the tree panel's nodes by arrow keys."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import (
    QAccessible,
    QAccessibleAnnouncementEvent,
    QAccessibleEvent,
    QHelpEvent,
    QKeySequence,
)
from PySide6.QtWidgets import QApplication, QToolTip
from pytestqt.qtbot import QtBot

from app.chat.chat_model import ChatModel, ChatRole, MessageRow, rows_from_tree
from app.chat.chat_view import ChatView
from app.look import accessibility
from app.tree.tree_panel import TreePanel, panel_nodes_from_tree
from app.window.main_window import MainWindow
from engine.core.tree import Role, Tree
from tests.app_fixtures import send

ACCESSIBLE_TEXT = Qt.ItemDataRole.AccessibleTextRole
ACCESSIBLE_DESCRIPTION = Qt.ItemDataRole.AccessibleDescriptionRole
ALT = Qt.KeyboardModifier.AltModifier


def versions_tree() -> tuple[Tree, dict[str, int]]:
    """system → u1 → (a1, a1b*) → u2 → a2 ; u1 also has a sibling u1b → a3.
    The active path is u1, a1b, u2, a2."""
    tree = Tree("You are terse.")
    ids: dict[str, int] = {}
    ids["u1"] = tree.add_child(tree.root_id, Role.USER, "Hello **there**").id
    ids["a1"] = tree.add_child(ids["u1"], Role.ASSISTANT, "Hi").id
    ids["a1b"] = tree.add_sibling(ids["a1"], "Hi, version two").id
    ids["u2"] = tree.add_child(ids["a1b"], Role.USER, "Show code").id
    ids["a2"] = tree.add_child(ids["u2"], Role.ASSISTANT,
                               "Sure:\n\n```python\nprint(1)\n```").id
    ids["u1b"] = tree.add_sibling(ids["u1"], "Hello again").id
    ids["a3"] = tree.add_child(ids["u1b"], Role.ASSISTANT, "Welcome back").id
    tree.set_active(ids["a2"])
    return tree, ids


@pytest.fixture
def announcements(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, str]]:
    """Every announcement Arbor sends to assistive technology: (sender, message)."""
    seen: list[tuple[Any, str]] = []
    deliver = QAccessible.updateAccessibility

    def record(event: QAccessibleEvent) -> None:
        if isinstance(event, QAccessibleAnnouncementEvent):
            seen.append((event.object(), event.message()))
        deliver(event)

    monkeypatch.setattr(accessibility.QAccessible, "updateAccessibility", record)
    return seen


@pytest.fixture
def view(qtbot: QtBot) -> Iterator[ChatView]:
    widget = ChatView()
    qtbot.addWidget(widget)
    widget.resize(640, 520)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget


@pytest.fixture
def panel(qtbot: QtBot) -> TreePanel:
    widget = TreePanel()
    widget.resize(500, 400)
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


# --- what the chat's rows say -----------------------------------------------------------


def test_screen_readers_hear_who_which_version_and_the_controls_keys(view: ChatView) -> None:
    tree, _ = versions_tree()
    view.set_rows(rows_from_tree(tree))
    interface = QAccessible.queryAccessibleInterface(view)
    assert interface.text(QAccessible.Text.Name) == "Messages"
    assert interface.childCount() == 4
    items = [interface.child(i) for i in range(interface.childCount())]
    names = [item.text(QAccessible.Text.Name) for item in items]
    descriptions = [item.text(QAccessible.Text.Description) for item in items]
    # Who wrote it and what it says, without Markdown marks; which version where there are
    # several (u1 has a sibling too).
    assert names == ["You, version 1 of 2: Hello there",
                     "Assistant, version 2 of 2: Hi, version two",
                     "You: Show code", "Assistant: Sure:\nprint(1)"]
    # The description names the painted controls and their keys.
    assert "Version 2 of 2" in descriptions[1] and "Alt+Left" in descriptions[1]
    assert "Alt+Right" in descriptions[1]
    assert descriptions[2] == ""
    assert "1 code block (python)" in descriptions[3] and "copy button" in descriptions[3]
    assert "Ctrl+Alt+C" in descriptions[3]


def test_what_a_row_says_follows_its_state_and_is_reported_when_it_changes(
    qtbot: QtBot,
) -> None:
    model = ChatModel()
    model.set_rows([MessageRow(1, "user", "Q", "complete", 0, 1),
                    MessageRow(2, "assistant", "", "streaming", 0, 1)])
    index = model.index(1, 0)
    with qtbot.waitSignal(model.dataChanged) as blocker:
        model.update_text(2, "```sh\nls", "streaming")
    assert ACCESSIBLE_TEXT in blocker.args[2] and ACCESSIBLE_DESCRIPTION in blocker.args[2]
    assert index.data(ACCESSIBLE_TEXT) == "Assistant, still writing: ls"
    assert "copy button" not in index.data(ACCESSIBLE_DESCRIPTION)  # none while it streams
    model.update_text(2, "```sh\nls\n```", "interrupted")
    assert index.data(ACCESSIBLE_TEXT) == "Assistant, interrupted: ls"
    assert "copy button" in index.data(ACCESSIBLE_DESCRIPTION)
    # A regenerated reply gives the shown one a sibling: its row says "1 of 2" now.
    with qtbot.waitSignal(model.dataChanged) as blocker:
        model.set_rows([model.row_at(0), MessageRow(2, "assistant", "```sh\nls\n```",
                                                    "interrupted", 0, 2)])
    assert ACCESSIBLE_TEXT in blocker.args[2] and ChatRole.VariantsRole in blocker.args[2]
    assert index.data(ACCESSIBLE_TEXT) == "Assistant, version 1 of 2, interrupted: ls"


def test_a_reply_is_announced_once_when_it_stops_streaming(
    view: ChatView, announcements: list[tuple[Any, str]]
) -> None:
    view.set_rows([MessageRow(1, "user", "Q", "complete", 0, 1),
                   MessageRow(2, "assistant", "", "streaming", 0, 1)])
    for text in ("The", "The answer", "The answer is **42**."):
        view.update_text(2, text, "streaming")
    assert announcements == []
    view.update_text(2, "The answer is **42**.", "complete")
    assert announcements == [(view, "Reply finished: The answer is 42.")]
    view.update_text(2, "The answer is **42**.", "complete")  # nothing new to say
    assert len(announcements) == 1
    # A reply the user stops says so.
    view.set_rows([*view.model().rows(), MessageRow(3, "assistant", "Half", "streaming", 0, 1)])
    view.set_rows([*view.model().rows()[:2], MessageRow(3, "assistant", "Half", "interrupted",
                                                        0, 1)])
    assert announcements[-1] == (view, "Reply interrupted: Half")


def test_the_window_announces_a_finished_reply(
    fake_window: MainWindow, qtbot: QtBot, announcements: list[tuple[Any, str]]
) -> None:
    send(qtbot, fake_window, "Hello")
    reply = fake_window.chat.model().rows()[-1]
    assert reply.role == "assistant" and reply.status != "streaming"
    finished = [text for sender, text in announcements if sender is fake_window.chat]
    assert len(finished) == 1 and finished[0].startswith("Reply finished")


@pytest.mark.qt_log_ignore("This plugin does not support raise")
def test_the_painted_controls_name_themselves_and_their_keys_on_hover(view: ChatView) -> None:
    view.set_rows([MessageRow(1, "assistant", "Run:\n\n```sh\nls\n```", "complete", 1, 2)])
    view.viewport().grab()
    index = view.model().index(0, 0)
    rect, shown = view.visualRect(index), view.model().row_at(0)
    previous, following = view.delegate.switcher_rects(rect, shown)
    tips = {}
    for name, pos in (("copy", view.delegate.code_button_rects(rect, shown)[0].center()),
                      ("previous", previous.center()), ("next", following.center())):
        event = QHelpEvent(QEvent.Type.ToolTip, pos, view.viewport().mapToGlobal(pos))
        QApplication.sendEvent(view.viewport(), event)
        tips[name] = QToolTip.text()
    assert tips == {"copy": "Copy the code (Ctrl+Alt+C)",
                    "previous": "Previous version (Alt+Left)",
                    "next": "Next version (Alt+Right)"}
    QToolTip.hideText()


# --- the chat by keyboard ---------------------------------------------------------------


def test_switching_versions_and_copying_code_with_the_keyboard_only(
    offline_window: Callable[[Tree], MainWindow], qtbot: QtBot,
    announcements: list[tuple[Any, str]],
) -> None:
    tree, ids = versions_tree()
    win = offline_window(tree)
    win.activateWindow()
    qtbot.waitUntil(lambda: win.isActiveWindow(), timeout=5000)
    qtbot.keyClick(win.composer, Qt.Key.Key_J, Qt.KeyboardModifier.ControlModifier)
    chat = win.chat
    assert chat.hasFocus()
    shown = [row.node_id for row in chat.model().rows()]
    assert shown == [ids["u1"], ids["a1b"], ids["u2"], ids["a2"]]
    qtbot.keyClick(chat, Qt.Key.Key_Home)
    qtbot.keyClick(chat, Qt.Key.Key_Down)
    assert chat.current_row() is not None and chat.current_row().node_id == ids["a1b"]

    qtbot.keyClick(chat, Qt.Key.Key_Left, ALT)  # the first version of the reply
    assert [row.node_id for row in chat.model().rows()] == [ids["u1"], ids["a1"]]
    assert win.tree.active_path()[-1].id == ids["a1"]
    assert chat.current_row() is not None and chat.current_row().node_id == ids["a1"]
    assert chat.currentIndex().data(ACCESSIBLE_TEXT).startswith("Assistant, version 1 of 2")
    qtbot.keyClick(chat, Qt.Key.Key_Left, ALT)  # already the first: nothing happens
    assert win.tree.active_path()[-1].id == ids["a1"]
    qtbot.keyClick(chat, Qt.Key.Key_Right, ALT)  # back, with the rest of its branch
    assert [row.node_id for row in chat.model().rows()] == shown
    assert chat.current_row() is not None and chat.current_row().node_id == ids["a1b"]
    active = {node.id for node in win.tree.active_path()}
    assert {i for i, item in win.tree_panel.node_items().items() if item.highlighted} == active

    # The reply with code: Ctrl+Alt+C copies it, the status bar and a screen reader say so.
    qtbot.keyClick(chat, Qt.Key.Key_End)
    assert chat.current_row() is not None and chat.current_row().node_id == ids["a2"]
    qtbot.keyClick(chat, Qt.Key.Key_C,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier)
    assert win.statusBar().currentMessage() == "Copied"
    assert announcements[-1] == (chat, "Copied (python)")
    native = QKeySequence("Ctrl+Alt+C").toString(QKeySequence.SequenceFormat.NativeText)
    assert ("Copy code", native) in win.shortcut_table()  # in the F1 list


# --- the tree panel by keyboard ---------------------------------------------------------


def test_the_tree_panels_arrows_follow_the_drawing_and_enter_activates(
    panel: TreePanel, qtbot: QtBot, announcements: list[tuple[Any, str]]
) -> None:
    tree, ids = versions_tree()
    panel.set_tree(panel_nodes_from_tree(tree), [n.id for n in tree.active_path()])
    assert panel.accessibleName() == "Conversation tree"
    assert panel.focusPolicy() & Qt.FocusPolicy.TabFocus
    panel.setFocus()
    qtbot.waitUntil(panel.hasFocus, timeout=2000)
    # The keyboard starts at the shown branch's end.
    assert panel.current_node == ids["a2"]

    def press(key: Qt.Key) -> int | None:
        qtbot.keyClick(panel, key)
        return panel.current_node

    assert press(Qt.Key.Key_Up) == ids["u2"]
    assert press(Qt.Key.Key_Up) == ids["a1b"]
    assert panel.accessibleDescription() == (
        "Assistant, version 2 of 2, on the shown branch: Hi, version two")
    assert announcements[-1] == (panel, panel.accessibleDescription())
    assert press(Qt.Key.Key_Left) == ids["a1"]
    assert press(Qt.Key.Key_Left) == ids["a1"]  # no version further left
    assert panel.accessibleDescription() == "Assistant, version 1 of 2: Hi"
    assert press(Qt.Key.Key_Down) == ids["a1"]  # a1 has no follow-up
    assert press(Qt.Key.Key_Up) == ids["u1"]
    assert press(Qt.Key.Key_Right) == ids["u1b"]
    assert press(Qt.Key.Key_Down) == ids["a3"]
    assert press(Qt.Key.Key_Home) == tree.root_id
    assert panel.accessibleDescription().startswith("System prompt, on the shown branch")
    assert "2 branches from here" in panel.accessibleDescription()
    assert press(Qt.Key.Key_Down) == ids["u1"]  # down follows the shown branch
    assert press(Qt.Key.Key_End) == ids["a2"]
    press(Qt.Key.Key_Up)
    press(Qt.Key.Key_Up)
    press(Qt.Key.Key_Left)
    for key in (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Space):
        with qtbot.waitSignal(panel.node_clicked, timeout=1000) as blocker:
            qtbot.keyClick(panel, key)
        assert blocker.args == [ids["a1"]]
    # The focus ring is painted while the panel has the keyboard.
    focused = panel.viewport().grab().toImage()
    panel.clearFocus()
    qtbot.waitUntil(lambda: not panel.hasFocus(), timeout=2000)
    assert panel.viewport().grab().toImage() != focused


def test_enter_in_the_tree_shows_that_branch_in_the_chat(
    offline_window: Callable[[Tree], MainWindow], qtbot: QtBot
) -> None:
    tree, ids = versions_tree()
    win = offline_window(tree)
    win.activateWindow()
    qtbot.waitUntil(lambda: win.isActiveWindow(), timeout=5000)
    qtbot.keyClick(win.composer, Qt.Key.Key_T,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    panel = win.tree_panel
    assert panel.hasFocus() and panel.current_node == ids["a2"]
    qtbot.keyClick(panel, Qt.Key.Key_Home)
    qtbot.keyClick(panel, Qt.Key.Key_Down)
    qtbot.keyClick(panel, Qt.Key.Key_Right)
    assert panel.current_node == ids["u1b"]
    qtbot.keyClick(panel, Qt.Key.Key_Return)
    assert [row.node_id for row in win.chat.model().rows()] == [ids["u1b"], ids["a3"]]
    assert win.chat.current_row() is not None and win.chat.current_row().node_id == ids["u1b"]
    assert panel.hasFocus() and panel.current_node == ids["u1b"]
    assert panel.node_item(ids["u1b"]).highlighted
    assert "on the shown branch" in panel.accessibleDescription()
