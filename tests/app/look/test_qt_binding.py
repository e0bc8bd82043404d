"""Guards the Qt binding's version pin (pyproject.toml): PySide6 6.12.0 on CPython 3.11 loses a
reference to None on every void method call, and the process dies after a few thousand."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QApplication, QPlainTextEdit
from pytestqt.qtbot import QtBot


def test_void_calls_do_not_leak_references_to_none(qtbot: QtBot) -> None:
    assert QApplication.instance() is not None
    editor = QPlainTextEdit()
    qtbot.addWidget(editor)
    before = sys.getrefcount(None)
    for _ in range(500):
        editor.insertPlainText("x")
    assert sys.getrefcount(None) - before > -100
