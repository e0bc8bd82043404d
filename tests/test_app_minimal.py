"""The minimal window: the model loads on the engine thread and a reply streams into it."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QThread
from pytestqt.qtbot import QtBot

from app.main import MainWindow


def test_minimal_window_loads_a_model_and_streams_a_reply(
    qtbot: QtBot, tiny_models: dict[str, Path]
) -> None:
    window = MainWindow()
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.worker.loaded, timeout=60_000):
        window.load(str(tiny_models["dense"]))
    assert "dense" in window.statusBar().currentMessage()
    assert window.worker.thread() is not QThread.currentThread()
    window.composer.setPlainText("Hello there")
    with qtbot.waitSignal(window.worker.returned, timeout=60_000) as blocker:
        window.send_button.click()
    report = blocker.args[0]
    assert report.generated_tokens > 0
    assert "You: Hello there" in window.transcript.toPlainText()
    assert report.text in window.transcript.toPlainText()
    window.close()
    assert not window._thread.isRunning()


def test_a_broken_model_file_gives_a_message_not_a_traceback(
    qtbot: QtBot, tmp_path: Path, monkeypatch
) -> None:
    shown: list[str] = []
    monkeypatch.setattr(
        "app.main.QMessageBox.warning", lambda _parent, _title, text: shown.append(text)
    )
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    window = MainWindow()
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.worker.errored, timeout=30_000):
        window.load(str(bad))
    assert shown and "broken.gguf" in shown[0]
    window.close()
