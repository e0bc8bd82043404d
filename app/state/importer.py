"""File > Import off the GUI thread: the file is read, checked, turned into trees and written
to the database on a short-lived QThread, over its own SQLite connection.

A 41 MB ChatGPT `conversations.json` (1,500 conversations) takes about 4 s to parse and 2.6 s
to commit; either would freeze the window. The thread opens the database a second time
(`Store(path, recover=False)`: the program's own connection may be streaming a reply, which
must not be marked interrupted). The store writes the conversations hidden, in slices of
`IMPORT_SLICE` messages with a transaction each, and shows them all in one last short
transaction, so the import is all or nothing and yet never holds the write lock for long:
WAL lets the GUI thread's connection read throughout, and a GUI write waits for one slice
at most (well under SQLite's 5 s busy timeout). The window then reloads the sidebar.

One import at a time: `start` refuses a second file while one runs (returns False; the
window says so) rather than queueing, so a user who picked the wrong file is not surprised
by a second import minutes later.

Shutdown: `shutdown` sets the cancel event and waits for the thread. The parse sees the
event between its stages and every 100 conversations; the commit sees it within a few
thousand SQLite steps (a progress handler) and rolls back; the slices already written stay
hidden and the program's next start removes them. So closing the window mid-import shows
nothing, leaves no QThread running and never reaches "QThread: Destroyed while thread is
still running".
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.core.errors import ArborError, Cancelled
from engine.storage.checkpoints import Identity
from engine.storage.store import Store
from engine.storage.transfer import ImportResult, ParsedImport, commit_import, parse_import

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportedFile:
    """A file that passed every check and is in the database."""

    path: Path
    contents: ParsedImport
    result: ImportResult


@dataclass(frozen=True)
class RejectedFile:
    """A file that was not imported; `message` is one line, fit to show as it is."""

    path: Path
    message: str


class _ImportThread(QThread):
    """Runs one import. The outcome is left in attributes and read by the GUI thread after
    `finished` and `wait()`, so the QThread object is never dropped while it still runs."""

    def __init__(self, path: Path, database: Path, cancel: threading.Event,
                 identity: Identity | None = None) -> None:
        super().__init__()
        self.setObjectName("arbor-import")
        self.path = path
        self.database = database
        self.cancel = cancel
        self.identity = identity
        self.outcome: ImportedFile | RejectedFile | None = None

    def run(self) -> None:
        try:
            # Looked up at call time (not bound at import) so tests can wrap them.
            contents = parse_import(self.path, identity=self.identity, cancel=self.cancel)
            if self.cancel.is_set():
                return
            with Store(self.database, recover=False) as store:
                store.interrupt_when(self.cancel.is_set)
                result = commit_import(contents, store)
        except Cancelled:
            return  # abandoned by shutdown: nobody wants an outcome
        except ArborError as exc:
            if self.cancel.is_set():
                return  # the commit was interrupted and rolled back: nothing to report
            self.outcome = RejectedFile(self.path, str(exc))
            return
        except Exception as exc:  # a bug, not the file's fault: never leave the window waiting
            log.exception("importing %s failed unexpectedly", self.path)
            self.outcome = RejectedFile(
                self.path, f"an unexpected error stopped the import ({type(exc).__name__})"
            )
            return
        self.outcome = ImportedFile(self.path, contents, result)


class Importer(QObject):
    """Lives on the GUI thread; `imported` and `rejected` are emitted there, never elsewhere.
    `database` is the file of the window's store."""

    imported = Signal(object)  # ImportedFile
    rejected = Signal(object)  # RejectedFile

    def __init__(self, database: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._database = database
        self._thread: _ImportThread | None = None
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
        thread = _ImportThread(path, self._database, threading.Event(), identity)
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
        if isinstance(outcome, ImportedFile):
            self.imported.emit(outcome)
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
