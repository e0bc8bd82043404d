"""The window's handle on the engine: requests out, events back as one Qt signal.

`EngineClient` runs the Qt-free `EngineService` on one QThread, which owns llama.cpp; nothing
else touches it. Requests are queued to that thread; every event the service emits arrives on
the GUI thread as `received(object)`. Stop and pre-emption bypass the queue (see
`engine.service.Control`). The GUI thread never waits on the engine, except in `shutdown`,
which waits at most for the running chunk or token after a stop.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QMetaObject, QObject, Qt, QThread, Signal, Slot

from engine.protocol import ConfigureRequest, Event, GenerateRequest, LoadRequest, Request
from engine.service import EngineService, ThreadControl

# Requests a user waits for: they make any warm-up in flight stale.
PREEMPTING = (GenerateRequest, LoadRequest, ConfigureRequest)


class _Host(QObject):
    """Lives on the engine thread: runs each request and passes its events on."""

    emitted = Signal(object)  # an engine event, emitted on the engine thread

    def __init__(self, control: ThreadControl) -> None:
        super().__init__()
        self.service = EngineService(self._emit, control)
        self.thread_ident: int | None = None

    def _emit(self, event: Event) -> None:
        self.emitted.emit(event)

    @Slot(object)
    def handle(self, request: Request) -> None:
        self.thread_ident = threading.get_ident()
        self.service.handle(request)

    @Slot()
    def close(self) -> None:
        self.service.close()


class EngineClient(QObject):
    received = Signal(object)  # every engine event, delivered on the GUI thread
    _submit = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.control = ThreadControl()
        self._thread = QThread(self)
        self._thread.setObjectName("arbor-engine")
        self._host = _Host(self.control)
        self._host.moveToThread(self._thread)
        self._submit.connect(self._host.handle)
        self._host.emitted.connect(self.received)
        self._thread.start()

    @property
    def engine_thread_ident(self) -> int | None:
        """The thread llama.cpp runs on, once it has run a request (tests check it)."""
        return self._host.thread_ident

    @property
    def running(self) -> bool:
        return self._thread.isRunning()

    def send(self, request: Request) -> None:
        """Queue a request. A reply, a load or new settings pre-empt warm-ups first, so they
        wait at most for one chunk of a warm-up in flight."""
        if isinstance(request, PREEMPTING):
            self.control.preempt()
        self._submit.emit(request)

    def epoch(self) -> int:
        return self.control.epoch()

    def stop(self) -> None:
        """Stop the reply in progress (within a chunk or a token)."""
        self.control.stop()

    def shutdown(self) -> None:
        """Stop whatever runs, free the model on its own thread, end the thread."""
        if not self._thread.isRunning():
            return
        self.control.stop()
        self.control.preempt()
        QMetaObject.invokeMethod(self._host, "close", Qt.ConnectionType.BlockingQueuedConnection)
        self._thread.quit()
        self._thread.wait()

