"""The window's handle on the engine: `engine.service.client.EngineClient` with its events
turned into one Qt signal.

`ProcessEngine` (the app's) has the engine in a child process: a crash in llama.cpp costs that
process, never the window, and the window's process never loads llama.cpp. `ThreadEngine` has
it on a thread of this process: the measurement baseline, and how tests put a scripted fake
engine behind the window (`ThreadEngine(handler=...)`). Every event arrives on the GUI thread
as `received(object)`; the GUI thread never waits on the engine, except in `shutdown` (at most
a chunk or a token after the stop, then the process is killed).
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from engine.service.client import ClientKind, EngineClient, HandlerFactory, InProcessClient
from engine.service.protocol import Crash, EngineDied, Request

log = logging.getLogger(__name__)


class QtEngine(QObject):
    """An engine client whose events are delivered on the GUI thread."""

    received = Signal(object)  # every engine event no tap takes, on the GUI thread
    _arrived = Signal(object)  # emitted on the client's thread, delivered on the GUI thread

    def __init__(self, client: EngineClient, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self._arrived.connect(self._relay)
        client.listen(self._arrived.emit)

    @Slot(object)
    def _relay(self, event: object) -> None:
        """After `shutdown`, events still on their way are dropped: the window they were for
        has closed its store."""
        if self.client.running:
            if isinstance(event, EngineDied):
                log.error("the engine process ended: %s", event.describe())
            self.received.emit(event)

    def send(self, request: Request | Crash) -> None:
        self.client.send(request)

    def stop(self, request_id: int | None = None) -> None:
        self.client.stop(request_id)

    def preempt(self) -> None:
        self.client.preempt()

    def epoch(self) -> int:
        return self.client.epoch()

    def restart(self) -> None:
        self.client.restart()

    def shutdown(self) -> None:
        self.client.shutdown()

    def kill(self) -> None:
        self.client.kill()

    @property
    def running(self) -> bool:
        return self.client.running

    @property
    def pid(self) -> int | None:
        return self.client.pid


class ProcessEngine(QtEngine):
    def __init__(self, parent: QObject | None = None, *, log_file: Path | None = None) -> None:
        """`log_file`: the engine process's stderr (None: this process's)."""
        super().__init__(EngineClient.make(ClientKind.PROCESS, log_file=log_file), parent)


class ThreadEngine(QtEngine):
    def __init__(self, parent: QObject | None = None, *,
                 handler: HandlerFactory | None = None) -> None:
        """`handler`: the engine service by default (loads llama.cpp here)."""
        super().__init__(EngineClient.make(ClientKind.IN_PROCESS, handler=handler), parent)

    @property
    def engine_thread_ident(self) -> int | None:
        """The thread the engine runs on (tests check that llama.cpp ran only there)."""
        assert isinstance(self.client, InProcessClient)
        return self.client.thread_ident
