"""The window when a branch outgrows the context: each policy as a user meets it, the
marker in the chat, the gauge, and the choice kept with the conversation and the settings."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QStyleOptionViewItem
from pytestqt.qtbot import QtBot

from app.chat.chat_model import ChatRole
from app.chat.message_delegate import MessageDelegate
from app.dialogs.settings_dialog import SettingsDialog
from app.window.main_window import MainWindow
from engine.config.overrides import Overrides
from engine.config.settings import Settings, load_settings, save_settings
from engine.core.overflow import Overflow
from engine.core.results import LEFT_OUT
from engine.storage.store import Store
from tests.app_fixtures import TIMEOUT, destroy, send
from tests.engine.core.test_overflow import QUESTIONS


@pytest.fixture
def small_window(qtbot: QtBot, tmp_path: Path, tiny_models: dict[str, Path]
                 ) -> Iterator[MainWindow]:
    """The window on the tiny dense model with a 256-token context: a few turns fill it.
    The default policy stays "stop"; tests choose per conversation."""
    win = MainWindow(store=Store(tmp_path / "c.db"), settings=Settings(n_ctx=256, max_tokens=24))
    qtbot.addWidget(win)
    win.resize(1000, 760)
    win.show()
    with qtbot.waitSignal(win.model_ready, timeout=TIMEOUT):
        win.models.load_model(str(tiny_models["dense"]))
    yield win
    win.close()
    destroy(win)


@pytest.mark.engine_process  # `small_window` is the app's window on a real engine process
def test_leaving_the_oldest_out_marks_them_in_the_chat_and_the_gauge(
    qtbot: QtBot, small_window: MainWindow
) -> None:
    win = small_window
    win.controller.new_conversation()
    assert win.controller.set_overrides(Overrides(overflow=Overflow.DROP_OLDEST))
    for question in QUESTIONS:
        send(qtbot, win, question)
    tree = win.tree
    reply = tree.node(tree.active_leaf)
    left_out = reply.meta.get(LEFT_OUT)
    assert isinstance(left_out, int) and left_out >= 2
    # Every message is still there and shown; the ones the last reply did not read are
    # marked, and a divider stands above the first one it read.
    model = win.chat.model()
    assert model.rowCount() == 2 * len(QUESTIONS)
    outside = [model.index(r).data(ChatRole.OutsideRole) for r in range(model.rowCount())]
    assert outside == [True] * left_out + [False] * (model.rowCount() - left_out)
    starts = [r for r in range(model.rowCount())
              if model.index(r).data(ChatRole.ContextStartsRole)]
    assert starts == [left_out]
    assert "outside the context" in model.index(0).data(Qt.ItemDataRole.AccessibleTextRole)
    assert "outside the context" not in model.index(left_out).data(
        Qt.ItemDataRole.AccessibleTextRole)
    # The divider takes room of its own above the first message read.
    delegate = win.chat.itemDelegate()
    assert isinstance(delegate, MessageDelegate)
    option = QStyleOptionViewItem()
    option.rect = win.chat.visualRect(model.index(left_out))
    option.font = win.chat.font()
    row = model.row_at(left_out)
    with_divider = delegate.sizeHint(option, model.index(left_out)).height()
    delegate.clear_cache()
    model.set_rows([replace(r, context_starts=False) for r in model.rows()])
    assert delegate.sizeHint(option, model.index(left_out)).height() < with_divider
    assert row.context_starts
    # The gauge shows what the next reply reads, and how many messages it leaves out.
    win.context_gauge.update()
    fill = win.context_gauge.fill
    assert fill is not None and fill.dropping and not fill.warn
    assert fill.tokens < 256 < fill.total
    assert "left out" in win.context_bar.format()
    assert "stay in the conversation" in win.context_bar.toolTip()
    # The choice is the conversation's own: saved with it.
    cid = win.controller.current
    assert cid is not None
    assert Overrides.read(win.store.settings(cid)).overflow is Overflow.DROP_OLDEST


@pytest.mark.engine_process  # `small_window` is the app's window on a real engine process
def test_under_stop_an_overflow_says_how_to_go_on_and_keeps_every_message(
    qtbot: QtBot, small_window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    win = small_window
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))
    win.controller.new_conversation()
    sent = 0
    for question in QUESTIONS:
        win.composer.setPlainText(question)
        qtbot.keyClick(win.composer, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: win.replies.streaming is None, timeout=TIMEOUT)
        sent += 1
        if shown:
            break
    assert shown, "the branch should have outgrown 256 tokens"
    assert "the context holds 256" in shown[0]
    assert "leave the oldest messages out" in shown[0]
    # The question that did not fit is kept, unanswered; nothing was left out silently.
    asked = [n.text for n in win.tree.messages() if n.role.value == "user"]
    assert asked == QUESTIONS[:sent]
    assert not any(LEFT_OUT in n.meta for n in win.tree.messages())


def test_the_policy_is_a_setting_that_survives_a_restart(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    assert dialog.chosen().overflow is Overflow.STOP
    dialog.overflow.setCurrentIndex(dialog.overflow.findData(Overflow.DROP_OLDEST))
    chosen = dialog.chosen()
    assert chosen.overflow is Overflow.DROP_OLDEST
    path = tmp_path / "settings.json"
    save_settings(chosen, path)
    assert load_settings(path).settings.overflow is Overflow.DROP_OLDEST
    # A conversation's own choice overrides it, and a bad stored value is dropped.
    assert Overrides(overflow=Overflow.STOP).apply(chosen).overflow is Overflow.STOP
    assert Overrides.read({"overrides": {"overflow": "truncate"}}).overflow is None
