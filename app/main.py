"""`arbor`: the desktop program. For now a minimal window (one branch, streaming replies, Stop);
the branching chat view and the tree panel come with the GUI issue."""

from __future__ import annotations

import logging
import sys

from PySide6.QtCore import QThread, Signal, Slot
from PySide6.QtGui import QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.worker import EngineWorker, ModelLoaded, Progress
from engine.errors import ArborError
from engine.model import default_model_path
from engine.session import StepReport

log = logging.getLogger(__name__)


class MainWindow(QMainWindow):
    request_load = Signal(str)
    request_send = Signal(str)
    request_shutdown = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.setWindowTitle("Arbor")
        self.resize(820, 640)
        self._busy = False
        self.transcript = QPlainTextEdit(readOnly=True)
        self.composer = QPlainTextEdit(placeholderText="Write a message; Ctrl+Enter sends")
        self.composer.setMaximumHeight(110)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self._on_send_clicked)
        self.progress = QProgressBar(visible=False)
        row = QHBoxLayout()
        row.addWidget(self.composer)
        row.addWidget(self.send_button)
        layout = QVBoxLayout()
        layout.addWidget(self.transcript)
        layout.addWidget(self.progress)
        layout.addLayout(row)
        central = QWidget()
        central.setLayout(layout)
        self.setCentralWidget(central)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self._on_send_clicked)
        QShortcut(QKeySequence("Escape"), self, activated=self._stop)

        self._thread = QThread(self)
        self._thread.setObjectName("arbor-engine")
        self.worker = EngineWorker()
        self.worker.moveToThread(self._thread)
        self.request_load.connect(self.worker.load)
        self.request_send.connect(self.worker.send)
        self.request_shutdown.connect(self.worker.shutdown)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.progress.connect(self._on_progress)
        self.worker.yielded.connect(self._on_text)
        self.worker.returned.connect(self._on_returned)
        self.worker.aborted.connect(self._on_aborted)
        self.worker.errored.connect(self._on_error)
        self._thread.start()
        self._set_busy(True)
        self.statusBar().showMessage("Loading the model…")

    def load(self, path: str) -> None:
        self.request_load.emit(path)

    @Slot()
    def _on_send_clicked(self) -> None:
        if self._busy:
            self._stop()
            return
        text = self.composer.toPlainText().strip()
        if not text:
            return
        self.composer.clear()
        self.transcript.appendPlainText(f"You: {text}\n")
        self.transcript.appendPlainText("Arbor: ")
        self._set_busy(True)
        self.request_send.emit(text)

    @Slot()
    def _stop(self) -> None:
        self.worker.request_stop()

    def _set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.send_button.setText("Stop" if busy else "Send")

    @Slot(object)
    def _on_loaded(self, info: ModelLoaded) -> None:
        self._set_busy(False)
        self.statusBar().showMessage(
            f"{info.name} · {info.memory_kind} · {info.backend} · context {info.n_ctx}"
        )
        for notice in info.notices:
            QMessageBox.information(self, "Arbor", notice)

    @Slot(object)
    def _on_progress(self, progress: Progress) -> None:
        self.progress.setVisible(progress.done < progress.total)
        self.progress.setMaximum(max(1, progress.total))
        self.progress.setValue(progress.done)

    @Slot(str)
    def _on_text(self, piece: str) -> None:
        self.transcript.moveCursor(QTextCursor.MoveOperation.End)
        self.transcript.insertPlainText(piece)

    @Slot(object)
    def _on_returned(self, report: StepReport) -> None:
        self._set_busy(False)
        self.progress.setVisible(False)
        self.transcript.appendPlainText("")
        self.statusBar().showMessage(
            f"reused {report.reused_tokens} of {report.prompt_tokens} tokens, decoded "
            f"{report.decoded_tokens}; first token after {report.ttft_ms or 0:.0f} ms; "
            f"{report.generated_tokens} tokens generated"
        )

    @Slot()
    def _on_aborted(self) -> None:
        self._set_busy(False)
        self.progress.setVisible(False)
        self.statusBar().showMessage("Stopped")

    @Slot(str)
    def _on_error(self, message: str) -> None:
        self._set_busy(False)
        self.progress.setVisible(False)
        QMessageBox.warning(self, "Arbor", message)

    def closeEvent(self, event) -> None:
        self.worker.request_stop()
        self.request_shutdown.emit()
        self._thread.quit()
        self._thread.wait()
        super().closeEvent(event)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = QApplication(sys.argv)
    app.setApplicationName("Arbor")
    window = MainWindow()
    window.show()
    try:
        window.load(str(default_model_path()))
    except ArborError as exc:
        QMessageBox.critical(window, "Arbor", str(exc))
        return 1
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
