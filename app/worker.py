"""The engine thread: one EngineWorker on one QThread owns the runtime; nothing else touches it.

Requests and results that cross threads are immutable values. Stop sets a thread-safe flag the
engine checks between chunks, inside a chunk (llama.cpp's abort callback) and between tokens.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from engine.errors import ArborError, Cancelled
from engine.runtime import Runtime, RuntimeSettings
from engine.session import GenerationOptions, Session, StepReport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelLoaded:
    name: str
    memory_kind: str
    backend: str
    n_ctx: int
    notices: tuple[str, ...]


@dataclass(frozen=True)
class Progress:
    done: int
    total: int


class EngineWorker(QObject):
    """Lives on the engine thread. Signals speak superqt's vocabulary."""

    loaded = Signal(object)  # ModelLoaded
    progress = Signal(object)  # Progress
    yielded = Signal(str)  # a piece of reply text
    returned = Signal(object)  # StepReport
    aborted = Signal()
    errored = Signal(str)  # a message for the user

    def __init__(self) -> None:
        super().__init__()
        self._session: Session | None = None
        self._stop = threading.Event()

    def request_stop(self) -> None:
        """Thread-safe: may be called from the GUI thread while the worker is busy."""
        self._stop.set()

    @Slot(str)
    def load(self, path: str) -> None:
        try:
            runtime = Runtime(Path(path), RuntimeSettings())
        except ArborError as exc:
            self.errored.emit(str(exc))
            return
        if self._session is not None:
            self._session.runtime.close()
        self._session = Session(runtime)
        self.loaded.emit(
            ModelLoaded(
                name=runtime.model.info.name,
                memory_kind=runtime.memory_kind.value,
                backend=runtime.backend,
                n_ctx=runtime.n_ctx,
                notices=tuple(runtime.notices),
            )
        )

    @Slot(str)
    def send(self, text: str) -> None:
        if self._session is None:
            self.errored.emit("no model is loaded")
            return
        self._stop.clear()
        options = GenerationOptions(
            max_tokens=512,
            on_progress=lambda done, total: self.progress.emit(Progress(done, total)),
            on_text=self.yielded.emit,
            cancel=self._stop.is_set,
        )
        try:
            report: StepReport = self._session.send(text, options)
        except Cancelled:
            self.aborted.emit()
            return
        except ArborError as exc:
            self.errored.emit(str(exc))
            return
        if self._stop.is_set():
            self.aborted.emit()
        self.returned.emit(report)

    @Slot()
    def shutdown(self) -> None:
        if self._session is not None:
            self._session.runtime.close()
            self._session = None
