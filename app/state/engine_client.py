"""The window's handle on the engine: requests out, events back as one Qt signal.

Two kinds, one interface. `ProcessEngine` (the app's) runs the engine service in a child
process (`engine.service.process`): a crash in llama.cpp costs that process, never the window, and
the
window's process never loads llama.cpp. `ThreadEngine` (app.state.engine_thread) runs it on a
QThread
of this process: the measurement baseline and what the benchmark compares with.

Every event arrives on the GUI thread as `received(object)`; when the engine process ends
without being asked to, `EngineDied` arrives and `restart` starts a new one. Stop and
pre-emption bypass the request queue. The GUI thread never waits on the engine, except in
`shutdown` (at most a chunk or a token after the stop, then the process is killed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from engine.service.process import EngineProcess
from engine.service.protocol import (
    ConfigureRequest,
    Crash,
    EngineDied,
    Event,
    GenerateRequest,
    LoadRequest,
    Request,
)

log = logging.getLogger(__name__)

# Requests a user waits for: they make any warm-up in flight stale.
PREEMPTING = (GenerateRequest, LoadRequest, ConfigureRequest)


class EngineClient(QObject):
    """What the window needs of an engine; see the two kinds above."""

    received = Signal(object)  # every engine event, delivered on the GUI thread

    def send(self, request: Request) -> None:
        raise NotImplementedError

    def stop(self, request_id: int | None = None) -> None:
        """Stop the reply of `request_id`, running or queued (within a chunk or a token),
        and no other: the window and the local API each stop their own. None: whatever
        runs."""
        raise NotImplementedError

    def preempt(self) -> None:
        """Make any warm-up in flight or queued stale (it stops within a chunk)."""
        raise NotImplementedError

    def epoch(self) -> int:
        """Real requests sent so far (a warm-up carries it; a newer one makes it stale)."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """Stop whatever runs, free the model, end the engine."""
        raise NotImplementedError

    def restart(self) -> None:
        """A new engine after one died (nothing loaded)."""
        raise NotImplementedError

    @property
    def running(self) -> bool:
        raise NotImplementedError


class ProcessEngine(EngineClient):
    _arrived = Signal(object)  # emitted on the reader thread, delivered on the GUI thread

    def __init__(self, parent: QObject | None = None, *, log_file: Path | None = None) -> None:
        """`log_file`: the engine process's stderr (None: this process's)."""
        super().__init__(parent)
        self._log_file = log_file
        self._arrived.connect(self._relay)
        self._process: EngineProcess | None = None
        # Requests whose events go elsewhere than the window (the local API's), by id; their
        # events are handed over on the reader thread and never reach `received`.
        self._taps: dict[int, Callable[[Event], None]] = {}
        # The current process's death once the reader has handed it to the taps: a tap
        # made later gets it at once (its request would go to a dead process). The lock
        # makes "handed to the taps" and "a tap made" one order.
        self._died: EngineDied | None = None
        self._taps_lock = threading.Lock()
        self.restart()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and not self._process.closing

    def restart(self) -> None:
        # The count goes on: a warm-up sent before the crash stays stale.
        process = EngineProcess(epoch=self._process.epoch() if self._process else 0,
                                log_file=self._log_file)
        with self._taps_lock:
            self._process, self._died = process, None
        threading.Thread(target=self._pump, args=(process,), name="arbor-engine-events",
                         daemon=True).start()

    def _pump(self, process: EngineProcess) -> None:
        """The reader thread: every event, in order, to the GUI thread."""
        while True:
            event = process.recv()
            if isinstance(event, EngineDied):
                with self._taps_lock:
                    if process is self._process:
                        self._died = event
                    taps = list(self._taps.values())
                for tap in taps:
                    tap(event)
                if not process.closing:
                    log.error("the engine process ended: %s", event.describe())
                    self._arrived.emit(event)
                return
            request_id = getattr(event, "request_id", None)
            receive = self._taps.get(request_id) if isinstance(request_id, int) else None
            if receive is not None:
                receive(event)
            else:
                self._arrived.emit(event)

    @Slot(object)
    def _relay(self, event: object) -> None:
        """On the GUI thread. After `shutdown`, events still on their way are dropped: the
        window they were for has closed its store."""
        if self._process is not None and not self._process.closing:
            self.received.emit(event)

    def tap(self, request_id: int, receive: Callable[[Event], None] | None) -> None:
        """Hand the events of `request_id` to `receive` (on the reader thread), not to the
        window; None ends it. An engine death reaches every tap, and a tap made after the
        engine died (before the window restarted it) gets that death at once, on the calling
        thread."""
        with self._taps_lock:
            if receive is None:
                self._taps.pop(request_id, None)
                return
            self._taps[request_id] = receive
            died = self._died
        if died is not None:
            receive(died)

    def send(self, request: Request | Crash) -> None:
        process = self._process
        if process is None or process.closing:
            return
        if isinstance(request, PREEMPTING):
            process.preempt()
        process.send(request)

    def stop(self, request_id: int | None = None) -> None:
        if self._process is not None:
            self._process.stop(request_id)

    def preempt(self) -> None:
        if self._process is not None:
            self._process.preempt()

    def epoch(self) -> int:
        return self._process.epoch() if self._process is not None else 0

    def kill(self) -> None:
        """SIGKILL the engine process (tests)."""
        if self._process is not None:
            self._process.kill()

    def shutdown(self) -> None:
        if self._process is not None and not self._process.closing:
            self._process.shutdown()
