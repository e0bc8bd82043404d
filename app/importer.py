"""File > Import off the GUI thread: the file is read, parsed and validated on a short-lived
QThread; the GUI thread, which owns the Store, only commits what comes back.

A 46 MB ChatGPT `conversations.json` takes seconds to parse, which used to freeze the window.
`engine.transfer.parse_import` needs no store, so it runs here; `commit_import` (one SQLite
transaction) stays with the caller on the GUI thread.

One import at a time: `start` refuses a second file while one is being read (returns False;
the window says so in the status bar) rather than queueing, so a user who picked the wrong
file is not surprised by a second import minutes later.

Shutdown: `shutdown` sets the cancel event, waits for the thread (the parse sees the event
between its stages; at worst the wait lasts as long as the rest of one parse) and drops any
result, so closing the window mid-import commits nothing, leaves no QThread running and never
reaches "QThread: Destroyed while thread is still running".
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.checkpoints import Identity
from engine.errors import ArborError, Cancelled
from engine.transfer import ParsedImport, parse_import

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParsedFile:
    """A file that passed every check; the GUI thread commits `contents` to the store."""

    path: Path
    contents: ParsedImport


@dataclass(frozen=True)
class RejectedFile:
    """A file that was not imported; `message` is one line, fit to show as it is."""

    path: Path
    message: str


class _ParseThread(QThread):
    """Runs one parse. The outcome is left in attributes and read by the GUI thread after
    `finished` and `wait()`, so the QThread object is never dropped while it still runs."""

    def __init__(self, path: Path, cancel: threading.Event,
                 identity: Identity | None = None) -> None:
        super().__init__()
        self.setObjectName("arbor-import")
        self.path = path
        self.cancel = cancel
        self.identity = identity
        self.outcome: ParsedFile | RejectedFile | None = None

    def run(self) -> None:
        try:
            # Looked up at call time (not bound at import) so tests can wrap it.
            contents = parse_import(self.path, identity=self.identity, cancel=self.cancel)
        except Cancelled:
            return  # abandoned by shutdown: nobody wants an outcome
        except ArborError as exc:
            self.outcome = RejectedFile(self.path, str(exc))
            return
        except Exception as exc:  # a bug, not the file's fault: never leave the window waiting
            log.exception("importing %s failed unexpectedly", self.path)
            self.outcome = RejectedFile(
                self.path, f"an unexpected error stopped the import ({type(exc).__name__})"
            )
            return
        self.outcome = ParsedFile(self.path, contents)


class Importer(QObject):
    """Lives on the GUI thread; `parsed` and `rejected` are emitted there, never elsewhere."""

    parsed = Signal(object)  # ParsedFile
    rejected = Signal(object)  # RejectedFile

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: _ParseThread | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        return self._thread is not None

    @property
    def current_path(self) -> Path | None:
        return self._thread.path if self._thread is not None else None

    def start(self, path: Path, identity: Identity | None = None) -> bool:
        """Read `path` in the background; False (nothing started) while another import runs
        or after shutdown. Session-file checkpoints are kept when they match `identity`
        (the loaded model's context)."""
        if self._closed or self._thread is not None:
            return False
        thread = _ParseThread(path, threading.Event(), identity)
        # The thread object lives on the GUI thread, so `finished` (emitted by the parse
        # thread as it ends) is delivered here through the event loop.
        thread.finished.connect(self._on_finished)
        self._thread = thread
        thread.start()
        return True

    @Slot()
    def _on_finished(self) -> None:
        thread = self._thread
        if thread is None:
            return  # abandoned by shutdown: its outcome is dropped
        thread.wait()  # `finished` is emitted just before the thread ends: let it end
        self._thread = None
        outcome = thread.outcome
        if isinstance(outcome, ParsedFile):
            self.parsed.emit(outcome)
        elif isinstance(outcome, RejectedFile):
            self.rejected.emit(outcome)

    def shutdown(self) -> None:
        """Abandon any import and end its thread; nothing is emitted afterwards. Idempotent."""
        self._closed = True
        thread, self._thread = self._thread, None
        if thread is None:
            return
        thread.cancel.set()
        thread.wait()  # a `finished` still queued for _on_finished finds no thread: ignored
        log.info("import of %s abandoned", thread.path.name)
