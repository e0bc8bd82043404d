"""The Settings dialog's pages: it fits a 1280x720 laptop screen, every control is on a page
the list and the keyboard reach, and Tab walks a page's fields in the order they are shown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from app.dialogs.settings_dialog import WINDOW_FRAME, SettingsDialog, open_size
from engine.config.settings import Settings

PAGES = ["Model", "Checkpoints", "Replies", "Tools", "Local API", "Hugging Face",
         "Appearance"]
# What a 1280x720 screen leaves a dialog: a panel or task bar, and the dialog's title bar.
SCREEN_W, SCREEN_H = 1280, 720 - 48 - 40


@pytest.fixture
def dialog(qtbot: QtBot) -> Iterator[SettingsDialog]:
    made = SettingsDialog(Settings())
    qtbot.addWidget(made)
    made.show()
    qtbot.waitExposed(made)
    made.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is made)
    yield made


def _controls(dialog: SettingsDialog) -> dict[str, QWidget]:
    named = {name: getattr(dialog, name) for name in (
        "n_ctx", "n_gpu_layers", "n_threads", "flash_attn", "type_k", "type_v", "rpc_workers",
        "ram_budget", "disk_tier", "interval", "temperature", "top_p", "seed", "max_tokens",
        "overflow", "api_server", "api_port", "api_key", "theme")}
    named.update(dialog.samplers)
    named.update({"mcp": dialog.mcp.list, "mcp_add": dialog.mcp.add,
                  "hf_token": dialog.token.field})
    return named


def _page_of(dialog: SettingsDialog) -> dict[str, str]:
    """Each control's page: the one on which it is visible."""
    where: dict[str, str] = {}
    for name in dialog.page_names():
        dialog.show_page(name)
        assert dialog.pages.currentWidget().accessibleName() == name
        for control, widget in _controls(dialog).items():
            if widget.isVisible():
                assert control not in where, f"{control} is on {where[control]} and {name}"
                where[control] = name
    return where


def test_the_dialog_fits_a_1280x720_screen(qtbot: QtBot) -> None:
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    for hint in (dialog.sizeHint(), dialog.minimumSizeHint()):
        assert hint.width() <= SCREEN_W and hint.height() <= SCREEN_H, hint
    # Each page scrolls rather than stretch the dialog past the screen.
    assert all(dialog.pages.widget(i).minimumSizeHint().height() < SCREEN_H // 2
               for i in range(dialog.pages.count()))


def test_it_opens_at_its_size_within_the_screen(dialog: SettingsDialog) -> None:
    room = dialog.screen().availableGeometry().size()
    assert dialog.size() == open_size(dialog.sizeHint(), dialog.minimumSizeHint(), room)
    # Qt alone would stop at two thirds of the screen's height (480 of 720).
    wanted, least = QSize(640, 560), QSize(600, 140)
    assert open_size(wanted, least, QSize(1280, 720 - 40)) == wanted
    assert open_size(wanted, least, QSize(1280, 400)) == QSize(640, 400 - WINDOW_FRAME.height())
    assert open_size(wanted, least, QSize(500, 100)) == least


def test_every_control_is_on_one_page_and_every_page_is_reachable(
        dialog: SettingsDialog) -> None:
    assert dialog.page_names() == PAGES
    where = _page_of(dialog)
    assert set(where) == set(_controls(dialog))  # none is on no page
    assert {where[c] for c in ("n_ctx", "rpc_workers")} == {"Model"}
    assert {where[c] for c in ("ram_budget", "disk_tier", "interval")} == {"Checkpoints"}
    assert {where[c] for c in ("temperature", "top_k", "seed", "overflow")} == {"Replies"}
    assert {where[c] for c in ("mcp", "mcp_add")} == {"Tools"}
    assert {where[c] for c in ("api_server", "api_port", "api_key")} == {"Local API"}
    assert (where["hf_token"], where["theme"]) == ("Hugging Face", "Appearance")


def test_the_keyboard_reaches_every_page(dialog: SettingsDialog, qtbot: QtBot) -> None:
    assert dialog.sections.hasFocus()  # the list has the focus first: arrows choose a page
    for number in range(1, len(PAGES)):
        qtbot.keyClick(dialog.sections, Qt.Key.Key_Down)
        assert dialog.pages.currentIndex() == number
    qtbot.keyClick(dialog.sections, Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier)
    assert dialog.pages.currentIndex() == 0  # Ctrl+Tab, round the end
    dialog.n_ctx.setFocus()
    seen = []
    for _ in PAGES:  # from a field, Ctrl+PgDown turns the pages, round to the first
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_PageDown,
                       Qt.KeyboardModifier.ControlModifier)
        seen.append(dialog.page_names()[dialog.pages.currentIndex()])
    assert seen == [*PAGES[1:], PAGES[0]]
    # Ctrl+Shift+Tab, as a keyboard sends it (Shift+Tab is Backtab), turns back.
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Backtab,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert dialog.pages.currentIndex() == len(PAGES) - 1
    # The focus follows onto the page shown, never stays on a hidden one.
    focus = QApplication.focusWidget()
    assert focus is not None and focus.isVisible()


def test_tab_walks_a_page_in_the_order_it_is_shown(dialog: SettingsDialog, qtbot: QtBot) -> None:
    order = []
    for _ in range(12):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        order.append(QApplication.focusWidget())
    model = [dialog.n_ctx, dialog.n_gpu_layers, dialog.n_threads, dialog.flash_attn,
             dialog.type_k, dialog.type_v, dialog.rpc_workers]
    ok = dialog.buttons.button(dialog.buttons.StandardButton.Ok)
    assert order[:len(model) + 1] == [*model, ok]
    dialog.show_page("Replies")
    dialog.sections.setFocus()
    qtbot.keyClick(dialog.sections, Qt.Key.Key_Tab)
    assert QApplication.focusWidget() is dialog.temperature
    qtbot.keyClick(dialog.temperature, Qt.Key.Key_Tab)
    assert QApplication.focusWidget() is dialog.top_p
