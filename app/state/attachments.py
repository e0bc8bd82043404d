"""Documents the user attaches to the next message, read off the GUI thread.

A file comes from the Attach dialog, a drop on the composer or the chat, or a paste; each is
read on a short-lived QThread (`engine.files.documents.read_document`: PDF, DOCX and HTML are
parsed in a process of their own under memory and time limits). A file that cannot be read is
refused with one line and nothing else changes. The documents read wait here until the next
message takes them (`take`); one can be removed before that, and a read still going on can be
cancelled. Closing the window cancels the reads and waits for their threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal

from engine.core.attachments import Document
from engine.files.documents import DocumentError, read_document

log = logging.getLogger(__name__)
MOST = 16  # documents waiting for one message


class _ReadThread(QThread):
    """Reads one file; the outcome is left in attributes for the GUI thread."""

    def __init__(self, path: Path, cancel: threading.Event) -> None:
        super().__init__()
        self.setObjectName("arbor-attach")
        self.path = path
        self.cancel = cancel
        self.document: Document | None = None
        self.error = ""

    def run(self) -> None:
        try:
            self.document = read_document(self.path, cancel=self.cancel.is_set)
        except DocumentError as exc:
            self.error = str(exc)
        except Exception as exc:  # a reader's bug must not cost the window
            log.exception("reading %s failed", self.path)
            self.error = f"{self.path.name} could not be read ({type(exc).__name__})"


class Attachments(QObject):
    """The next message's documents, and the files being read for it."""

    changed = Signal()  # the documents waiting, or the files being read, changed
    refused = Signal(str)  # one line: why a file was not attached
    # A document read whole is longer than the room the context has (`room`): the owner
    # asks the user (its start, a search, or not at all) and calls `keep` with the choice.
    too_long = Signal(object, int)  # (Document, the characters there is room for)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._documents: list[Document] = []
        self._reading: dict[_ReadThread, threading.Event] = {}
        # The characters the next message's documents may take together (None: no limit
        # known, no model loaded).
        self.room: Callable[[], int | None] = lambda: None

    @property
    def documents(self) -> tuple[Document, ...]:
        return tuple(self._documents)

    @property
    def reading(self) -> tuple[str, ...]:
        """The names of the files being read."""
        return tuple(thread.path.name for thread in self._reading)

    def add(self, paths: list[Path]) -> None:
        """Read these files (each on a thread of its own) for the next message."""
        for path in paths:
            if len(self._documents) + len(self._reading) >= MOST:
                self.refused.emit(f"{path.name} was not attached: a message takes at most "
                                  f"{MOST} documents")
                continue
            cancel = threading.Event()
            thread = _ReadThread(path, cancel)
            thread.finished.connect(lambda t=thread: self._done(t))
            self._reading[thread] = cancel
            thread.start()
        self.changed.emit()

    def keep(self, document: Document) -> None:
        """Attach `document` as the user chose to have it read (after `too_long`)."""
        self._documents.append(document)
        self.changed.emit()

    def remove(self, index: int) -> None:
        if 0 <= index < len(self._documents):
            del self._documents[index]
            self.changed.emit()

    def cancel(self) -> None:
        """Stop every read going on; their files are not attached."""
        for cancel in self._reading.values():
            cancel.set()

    def take(self) -> tuple[Document, ...]:
        """The documents for the message being sent; none wait afterwards."""
        out, self._documents = tuple(self._documents), []
        if out:
            self.changed.emit()
        return out

    def give_back(self, documents: tuple[Document, ...]) -> None:
        """A message that could not be sent keeps its documents for the next try."""
        if documents:
            self._documents[:0] = documents
            self.changed.emit()

    def shutdown(self) -> None:
        self.cancel()
        for thread in list(self._reading):
            thread.wait()
            self._done(thread)

    def _done(self, thread: _ReadThread) -> None:
        cancel = self._reading.pop(thread, None)
        if cancel is None:
            return  # already handled (shutdown)
        thread.wait()
        if thread.document is not None and not cancel.is_set():
            document = thread.document
            room = self.room()
            left = None if room is None else room - sum(d.reads for d in self._documents)
            if any(d.sha256 == document.sha256 for d in self._documents):
                self.refused.emit(f"{document.name} is attached already")
            elif left is not None and len(document.text) > left:
                self.too_long.emit(document, max(0, left))
            else:
                self._documents.append(document)
        elif thread.error and not cancel.is_set():
            self.refused.emit(thread.error)
        thread.deleteLater()
        self.changed.emit()
