"""The real main window, driven like a user would, on a real engine with a tiny model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.window.main_window import MainWindow
from engine.core.tree import NodeStatus, Role
from engine.storage.store import Store
from tests.app_fixtures import TIMEOUT, send


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
    qtbot: QtBot, window: MainWindow
) -> None:
    send(qtbot, window, "First question")
    send(qtbot, window, "Second question")
    old = _texts(window)
    first = window.tree.message(0).id
    with qtbot.waitSignal(window.reply_finished, timeout=TIMEOUT):
        window.controller.edit(first, "First question, edited")
    assert _texts(window)[0] == "First question, edited"
    row = window.chat.model().row_at(0)
    assert (row.variant, row.variants) == (1, 2)  # shown as < 2/2 >
    window.controller.switch_variant(window.tree.message(0).id, 0)
    assert _texts(window) == old


def test_regenerate_keeps_the_old_reply(qtbot: QtBot, window: MainWindow) -> None:
    send(qtbot, window, "Tell me something")
    reply = window.tree.message(1).id
    with qtbot.waitSignal(window.reply_finished, timeout=TIMEOUT):
        window.controller.regenerate(reply)
    assert len(window.tree.siblings(reply)) == 2
    assert window.chat.model().row_at(1).variants == 2


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


def test_rewind_and_send_starts_a_new_branch(qtbot: QtBot, window: MainWindow) -> None:
    send(qtbot, window, "One")
    send(qtbot, window, "Two")
    window.controller.rewind(window.tree.message(1).id)
    send(qtbot, window, "Two, differently")
    assert _texts(window)[2] == "Two, differently"
    assert len(window.tree.siblings(window.tree.message(2).id)) == 2


def test_fork_delete_and_undo(qtbot: QtBot, window: MainWindow) -> None:
    send(qtbot, window, "Root question")
    original = window.current
    window.controller.fork(window.tree.message(1).id)
    assert window.current != original
    assert _texts(window)[0] == "Root question"
    assert len(window.store.list()) == 2
    window.controller.delete_conversation(window.current)
    assert len(window.store.list()) == 1
    window.controller.undo()
    assert len(window.store.list()) == 2

    window.controller.open_conversation(original)
    reply = window.tree.message(1).id
    window.controller.delete_branch(reply)
    assert len(window.tree.messages()) == 1
    window.controller.undo()
    assert window.tree.message(1).id == reply
    with Store(window.store.path) as other:
        assert len(other.load(original).messages()) == 2


def test_clicking_a_node_in_the_tree_panel_activates_its_branch(
    qtbot: QtBot, window: MainWindow
) -> None:
    send(qtbot, window, "Alpha")
    first_reply = window.tree.message(1).id
    with qtbot.waitSignal(window.reply_finished, timeout=TIMEOUT):
        window.controller.edit(window.tree.message(0).id, "Beta")
    assert first_reply not in [n.id for n in window.tree.messages()]
    window.tree_panel.node_clicked.emit(first_reply)
    assert window.tree.message(1).id == first_reply


def test_importing_a_rejected_file_shows_one_clear_message(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))
    bad = tmp_path / "broken.arbor"
    bad.write_bytes(b"PK\x03\x04 this is not a zip")
    before = window.store.list()
    with qtbot.waitSignal(window.files.import_finished, timeout=TIMEOUT) as finished:
        assert window.files.import_path(bad)  # returns at once: the file is read off the GUI thread
    assert finished.args == [[]]
    assert window.store.list() == before
    assert len(shown) == 1 and "broken.arbor was not imported" in shown[0]
    assert "Traceback" not in shown[0]
    window.engine_used = True  # keep the fixture's engine check meaningful
    send(qtbot, window, "still works")


def test_a_broken_model_keeps_the_previous_one_working(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 100)
    with qtbot.waitSignal(window.model_failed, timeout=TIMEOUT):
        window.models.load_model(str(broken))
    assert shown and "broken.gguf" in shown[0]
    send(qtbot, window, "Are you there?")
    assert window.tree.message(1).text


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
