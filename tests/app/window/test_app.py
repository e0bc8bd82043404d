"""The real main window, driven like a user would: on the scripted fake engine for what the
window does with the engine's events, and on a real engine process with a tiny model for a real
reply, a real stop and closing while it answers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.window.main_window import MainWindow
from engine.core.tree import NodeStatus, Role
from engine.storage.store import Store
from tests.app_fixtures import TIMEOUT, send, warnings_shown
from tests.fake_engine import Script


def _texts(win: MainWindow) -> list[str]:
    return [n.text for n in win.tree.messages()]


def test_send_streams_a_reply_and_saves_it(qtbot: QtBot, window: MainWindow) -> None:
    send(qtbot, window, "Hello there")
    messages = window.tree.messages()
    assert [m.role for m in messages] == [Role.USER, Role.ASSISTANT]
    assert messages[1].text and messages[1].status is NodeStatus.COMPLETE
    model = window.chat.model()
    assert model.rowCount() == 2
    assert "reused" in window.statusBar().currentMessage()
    assert window.composer.toPlainText() == ""
    with Store(window.store.path) as other:  # saved, as another process would see it
        assert [n.text for n in other.load(window.current).messages()] == _texts(window)


def test_edit_an_early_message_branches_and_switching_back_restores(
    qtbot: QtBot, fake_window: MainWindow
) -> None:
    send(qtbot, fake_window, "First question")
    send(qtbot, fake_window, "Second question")
    old = _texts(fake_window)
    first = fake_window.tree.message(0).id
    with qtbot.waitSignal(fake_window.reply_finished, timeout=TIMEOUT):
        fake_window.controller.edit(first, "First question, edited")
    assert _texts(fake_window)[0] == "First question, edited"
    row = fake_window.chat.model().row_at(0)
    assert (row.variant, row.variants) == (1, 2)  # shown as < 2/2 >
    fake_window.controller.switch_variant(fake_window.tree.message(0).id, 0)
    assert _texts(fake_window) == old


def test_regenerate_keeps_the_old_reply(qtbot: QtBot, fake_window: MainWindow) -> None:
    send(qtbot, fake_window, "Tell me something")
    reply = fake_window.tree.message(1).id
    with qtbot.waitSignal(fake_window.reply_finished, timeout=TIMEOUT):
        fake_window.controller.regenerate(reply)
    assert len(fake_window.tree.siblings(reply)) == 2
    assert fake_window.chat.model().row_at(1).variants == 2


def test_stop_mid_reply_keeps_it_interrupted(qtbot: QtBot, window: MainWindow) -> None:
    window.models.apply_settings(replace(window.settings, max_tokens=2048))  # long enough to stop
    window.text_shown.connect(window.replies.stop)  # press Stop as soon as text arrives
    window.composer.setPlainText("Write a long story")
    with qtbot.waitSignal(window.reply_finished, timeout=TIMEOUT):
        qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    reply = window.tree.message(1)
    assert reply.meta["finish"] == "cancelled"
    assert reply.status is NodeStatus.INTERRUPTED and reply.text
    assert window.send_button.text() == "Send"
    window.text_shown.disconnect(window.replies.stop)
    window.models.apply_settings(replace(window.settings, max_tokens=48))
    partial = reply.text
    with qtbot.waitSignal(window.reply_finished, timeout=TIMEOUT):
        window.actions_by_name["continue"].trigger()
    assert reply.status is NodeStatus.COMPLETE
    assert reply.text.startswith(partial) and len(reply.text) > len(partial)
    assert len(window.tree.messages()) == 2  # the same reply grew; no new sibling


def test_rewind_and_send_starts_a_new_branch(qtbot: QtBot, fake_window: MainWindow) -> None:
    send(qtbot, fake_window, "One")
    send(qtbot, fake_window, "Two")
    fake_window.controller.rewind(fake_window.tree.message(1).id)
    send(qtbot, fake_window, "Two, differently")
    assert _texts(fake_window)[2] == "Two, differently"
    assert len(fake_window.tree.siblings(fake_window.tree.message(2).id)) == 2


def test_fork_delete_and_undo(qtbot: QtBot, fake_window: MainWindow) -> None:
    send(qtbot, fake_window, "Root question")
    original = fake_window.current
    fake_window.controller.fork(fake_window.tree.message(1).id)
    assert fake_window.current != original
    assert _texts(fake_window)[0] == "Root question"
    assert len(fake_window.store.list()) == 2
    fake_window.controller.delete_conversation(fake_window.current)
    assert len(fake_window.store.list()) == 1
    fake_window.controller.undo()
    assert len(fake_window.store.list()) == 2

    fake_window.controller.open_conversation(original)
    reply = fake_window.tree.message(1).id
    fake_window.controller.delete_branch(reply)
    assert len(fake_window.tree.messages()) == 1
    fake_window.controller.undo()
    assert fake_window.tree.message(1).id == reply
    with Store(fake_window.store.path) as other:
        assert len(other.load(original).messages()) == 2


def test_clicking_a_node_in_the_tree_panel_activates_its_branch(
    qtbot: QtBot, fake_window: MainWindow
) -> None:
    send(qtbot, fake_window, "Alpha")
    first_reply = fake_window.tree.message(1).id
    with qtbot.waitSignal(fake_window.reply_finished, timeout=TIMEOUT):
        fake_window.controller.edit(fake_window.tree.message(0).id, "Beta")
    assert first_reply not in [n.id for n in fake_window.tree.messages()]
    fake_window.tree_panel.node_clicked.emit(first_reply)
    assert fake_window.tree.message(1).id == first_reply


def test_importing_a_rejected_file_shows_one_clear_message(
    qtbot: QtBot, fake_window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))
    bad = tmp_path / "broken.arbor"
    bad.write_bytes(b"PK\x03\x04 this is not a zip")
    before = fake_window.store.list()
    with qtbot.waitSignal(fake_window.files.import_finished, timeout=TIMEOUT) as finished:
        assert fake_window.files.import_path(bad)  # at once: the file is read off the GUI thread
    assert finished.args == [[]]
    assert fake_window.store.list() == before
    assert len(shown) == 1 and "broken.arbor was not imported" in shown[0]
    assert "Traceback" not in shown[0]
    send(qtbot, fake_window, "still works")
    assert fake_window.tree.message(1).text == "You said: still works"


def test_a_broken_model_keeps_the_previous_one_working(
    qtbot: QtBot, fake_window: MainWindow, fake_engine: Script, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))
    loaded = fake_window.replies.model
    broken = str(tmp_path / "broken.gguf")
    fake_engine.failing_models[broken] = "the file is not a GGUF model"
    with qtbot.waitSignal(fake_window.model_failed, timeout=TIMEOUT):
        fake_window.models.load_model(broken)
    assert len(shown) == 1 and "the file is not a GGUF model" in shown[0]
    assert fake_window.replies.model is loaded
    send(qtbot, fake_window, "Are you there?")
    assert fake_window.tree.message(1).text == "You said: Are you there?"


def test_a_reply_that_fails_keeps_what_it_said_and_says_why(
    qtbot: QtBot, fake_window: MainWindow, fake_engine: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = warnings_shown(monkeypatch)
    fake_engine.reply_failure = "the engine ran out of memory"
    send(qtbot, fake_window, "Hello there")
    reply = fake_window.tree.message(1)
    assert reply.status is NodeStatus.INTERRUPTED and reply.text == "You"  # its first word
    assert shown == ["the engine ran out of memory"]
    assert fake_window.send_button.text() == "Send" and fake_window.replies.streaming is None
    fake_engine.reply_failure = None
    with qtbot.waitSignal(fake_window.reply_finished, timeout=TIMEOUT):
        fake_window.actions_by_name["continue"].trigger()
    assert reply.status is NodeStatus.COMPLETE and reply.text == "You You said: Hello there"
    assert len(fake_window.tree.messages()) == 2  # the same reply grew


@pytest.mark.engine_process  # the app's own window: its default engine is a process
def test_closing_while_answering_saves_the_partial_reply(
    qtbot: QtBot, tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    db = tmp_path / "c.db"
    win = MainWindow(store=Store(db))
    qtbot.addWidget(win)
    with qtbot.waitSignal(win.model_ready, timeout=TIMEOUT):
        win.models.load_model(str(tiny_models["dense"]))
    win.composer.setPlainText("Talk for a while")
    with qtbot.waitSignal(win.text_shown, timeout=TIMEOUT):
        qtbot.keyClick(win.composer, Qt.Key.Key_Return)
    cid = win.current
    win.close()
    assert not win.engine.running
    with Store(db) as store:
        reply = store.load(cid).message(1)
    assert reply.status is NodeStatus.INTERRUPTED


def test_the_message_keys_work_from_the_composer_on_the_last_message(
    qtbot: QtBot, fake_window: MainWindow
) -> None:
    """Ctrl+R in the composer regenerates the reply just read; Alt+Left shows the version
    before; Ctrl+E edits the last message. Delete and Ctrl+Backspace still edit the text."""
    win = fake_window
    send(qtbot, win, "Hello")
    win.composer.setFocus()
    qtbot.waitUntil(win.composer.hasFocus, timeout=TIMEOUT)
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        qtbot.keyClick(win.composer, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    reply = win.tree.messages()[-1]
    assert win.tree.siblings(reply.id).index(reply.id) == 1  # the second version
    qtbot.keyClick(win.composer, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(lambda: win.tree.messages()[-1].id != reply.id, timeout=TIMEOUT)
    win.composer.setFocus()
    win.composer.setPlainText("abc def")
    cursor = win.composer.textCursor()
    cursor.movePosition(cursor.MoveOperation.End)
    win.composer.setTextCursor(cursor)
    qtbot.keyClick(win.composer, Qt.Key.Key_Backspace, Qt.KeyboardModifier.ControlModifier)
    assert win.composer.toPlainText() == "abc "
    assert len(win.tree.messages()) == 2  # not a rewind
