"""Editing a message in place in the real main window, on the scripted fake engine."""

from __future__ import annotations

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.window.main_window import MainWindow
from engine.core.tree import NodeStatus, Role
from tests.app_fixtures import TIMEOUT


def test_editing_a_message_in_place_branches_and_answers_the_new_version(
    qtbot: QtBot, fake_window: MainWindow
) -> None:
    fake_window.composer.setPlainText("First question")
    with qtbot.waitSignal(fake_window.reply_finished, timeout=TIMEOUT):
        qtbot.keyClick(fake_window.composer, Qt.Key.Key_Return)
    chat = fake_window.chat
    original = fake_window.tree.message(0)
    first_reply = fake_window.tree.message(1).id

    assert chat.select_node(original.id)
    with qtbot.waitSignal(chat.edit_started, timeout=TIMEOUT) as started:
        chat.edit_action.trigger()
    assert started.args == [original.id]
    editor = chat.editor()
    assert editor is not None and editor.text() == "First question"
    qtbot.keyClicks(editor.text_edit, ", edited")
    with (
        qtbot.waitSignal(fake_window.reply_finished, timeout=TIMEOUT),
        qtbot.waitSignal(chat.edit_submitted, timeout=TIMEOUT) as submitted,
    ):
        qtbot.keyClick(editor.text_edit, Qt.Key.Key_Return)
    assert submitted.args == [original.id, "First question, edited"]
    assert chat.editor() is None and chat.editing_node is None

    tree = fake_window.tree
    edited = tree.message(0)
    assert edited.id != original.id and edited.role is Role.USER
    assert edited.text == "First question, edited" and original.text == "First question"
    assert tree.siblings(edited.id) == [original.id, edited.id]
    path = [node.id for node in tree.active_path()]
    assert edited.id in path and original.id not in path and first_reply not in path
    reply = tree.message(1)
    assert reply.parent == edited.id and reply.role is Role.ASSISTANT
    assert reply.status is NodeStatus.COMPLETE
    assert reply.text == "You said: First question, edited"  # it answered the new version
    row = chat.model().row_at(0)
    assert row.node_id == edited.id
    assert (row.variant, row.variants) == (1, 2)  # shown as < 2/2 >
    assert chat.delegate._counter_text(row) == "2/2"
    assert chat.model().row_at(1).node_id == reply.id
