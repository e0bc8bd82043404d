"""The engine on a QThread of the window's process: `ThreadEngine`.

The engine service runs on one QThread, which owns llama.cpp; requests are queued to it and
its events come back as `received`. A crash in llama.cpp takes the window with it: the app
runs `ProcessEngine` (app.state.engine_client); this one is the baseline the benchmark measures the
process against, and a way to run the window without a child process.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QMetaObject, QObject, Qt, QThread, Signal, Slot

from app.state.engine_client import PREEMPTING, EngineClient
from engine.service.handler import EngineService, ThreadControl
from engine.service.protocol import Event, GenerateRequest, Request


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


class ThreadEngine(EngineClient):
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
        if isinstance(request, GenerateRequest):
            self.control.clear_stop()  # a stop for no reply in particular was for an earlier one
        self._submit.emit(request)

    def preempt(self) -> None:
        self.control.preempt()

    def epoch(self) -> int:
        return self.control.epoch()

    def stop(self, request_id: int | None = None) -> None:
        self.control.stop(request_id)

    def restart(self) -> None:
        raise RuntimeError("an engine thread does not die: it takes the process with it")

    def shutdown(self) -> None:
        """Stop whatever runs, free the model on its own thread, end the thread."""
        if not self._thread.isRunning():
            return
        self.control.stop()
        self.control.preempt()
        QMetaObject.invokeMethod(self._host, "close", Qt.ConnectionType.BlockingQueuedConnection)
        self._thread.quit()
        self._thread.wait()

