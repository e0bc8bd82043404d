"""File > Import and Export: the dialogs, and what the window does with their outcome.

Imports are read and committed off the GUI thread (`app.state.importer`); checkpoints in a session
file that fit the loaded model go to the engine. A session file is written by the engine (it
holds the checkpoints); the other formats are written here. One clear message per failure.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app.state.controller import ChatController
from app.state.importer import ImportedFile, Importer, RejectedFile
from app.state.replies import EXPORT_LOST
from app.window.status import StatusArea
from engine.service.protocol import AdoptCheckpoints, ExportDone, ExportRequest
from engine.storage.transfer import FileFormat, export_file

SUFFIX = {FileFormat.NATIVE: "arbor", FileFormat.CHATGPT: "json", FileFormat.MARKDOWN: "md",
          FileFormat.OPENAI: "json"}


class FileActions(QObject):
    import_finished = Signal(object)  # list[int]: the new conversations, [] on failure
    export_finished = Signal(object)  # ExportDone

    def __init__(self, controller: ChatController, status: StatusArea, window: QWidget) -> None:
        super().__init__(window)
        self.controller = controller
        self.status = status
        self.window = window
        # The file is read and committed on the importer's thread, over its own connection
        # to this store's database; the window then shows the new conversations.
        self.importer = Importer(controller.store.path, self)
        self.importer.imported.connect(self._on_imported)
        self.importer.rejected.connect(self._on_rejected)
        controller.replies.exported.connect(self._on_exported)

    # --- import ------------------------------------------------------------------------------

    @Slot()
    def ask_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self.window, "Import", str(Path.home()),
            "Conversations (*.arbor *.json);;All files (*)")
        if path:
            self.import_path(Path(path))

    def import_path(self, path: Path) -> bool:
        """Start importing `path` and return at once; `import_finished` follows. False when
        another import is still being read (one at a time: the user is told, nothing queues)."""
        current = self.importer.current_path
        if current is not None:
            self.status.message(
                f"Still reading {current.name}; import {path.name} once it is done.", 6000)
            return False
        model = self.controller.replies.model
        if not self.importer.start(path, model.identity if model is not None else None):
            return False
        self.status.message(f"Reading {path.name}…")
        return True

    @Slot(object)
    def _on_imported(self, parsed: ImportedFile) -> None:
        ids = parsed.result.conversation_ids
        self.controller.listed.emit()
        if ids:
            self.controller.open_conversation(ids[0])
        carried = parsed.contents.checkpoints
        note = ""
        if carried:  # verified against the loaded model's identity while parsing
            self.controller.replies.send(AdoptCheckpoints(
                carried[0].identity, tuple(item.checkpoint for item in carried)))
            note = f" with {len(carried)} checkpoints"
        elif parsed.contents.dropped_checkpoints:
            note = (f"; its {parsed.contents.dropped_checkpoints} checkpoints were made for "
                    "another model or context and were left out")
        self.status.message(f"Imported {len(ids)} conversations{note}.")
        self.import_finished.emit(ids)

    @Slot(object)
    def _on_rejected(self, rejected: RejectedFile) -> None:
        self.status.bar.clearMessage()
        QMessageBox.warning(self.window, "Arbor",
                            f"{rejected.path.name} was not imported.\n\n{rejected.message}")
        self.import_finished.emit([])

    # --- export ------------------------------------------------------------------------------

    def ask_export(self, fmt: FileFormat) -> None:
        if self.controller.current is None:
            return
        path, _ = QFileDialog.getSaveFileName(self.window, "Export",
                                              f"conversation.{SUFFIX[fmt]}")
        if path:
            self.export_current(Path(path), fmt)

    def export_current(self, path: Path, fmt: FileFormat) -> None:
        """A session file is written by the engine, with the conversation's checkpoints
        (`export_finished` follows); the other formats are written here."""
        controller = self.controller
        if controller.current is None:
            return
        cid = controller.current
        if fmt is FileFormat.NATIVE:
            record = controller.fetch(lambda: controller.store.record(cid))
            if record is not None:
                self.status.message(f"Writing {path.name}…")
                controller.replies.send(ExportRequest(str(path), cid, (record,)))
            return
        if controller.attempt(lambda: export_file(controller.store, [cid], path, fmt)):
            self.status.message(f"Exported to {path}.", 6000)

    @Slot(object)
    def _on_exported(self, done: ExportDone) -> None:
        name = Path(done.path).name
        if done.error == EXPORT_LOST:  # the engine's death, told in its own message
            self.status.message(f"{name} was not exported: {done.error}.", 6000)
        elif done.error is not None:
            QMessageBox.warning(self.window, "Arbor", f"{name} was not exported: {done.error}")
        else:
            self.status.message(
                f"Exported to {done.path} with {done.checkpoints} checkpoints.", 6000)
        self.export_finished.emit(done)

    def shutdown(self) -> None:
        """Before the store closes: an abandoned parse commits nothing."""
        self.importer.shutdown()
