"""The engine in a process of its own: llama.cpp can abort, and only this process goes.

llama.cpp ends its process on an internal error (`GGML_ASSERT`, an allocation it cannot make,
any failure of an RPC worker), and no error code reaches Python. So the app runs the engine
service (`engine.service.handler`) in a child process and speaks to it over one
`multiprocessing` connection (pickled frozen dataclasses from `engine.service.protocol`, in order).

In the child a reader thread takes every message as it comes: control messages (`Stop`,
`Preempt`, `Shutdown`, `Crash`) act at once, requests queue for the main thread, which runs
them one at a time. So Stop takes effect within a chunk or a token whatever is running, and a
front end's send never waits for the engine to finish something. Checkpoint blobs cross as
raw bytes (`send_bytes`), one message each, never inside one giant pickle. The child exits as
soon as its parent is gone: the connection's end of file (the kernel closes the parent's end
when the parent dies, however it dies), and as soon as a message cannot be read (a reader
that went on would leave the engine deaf and its front end waiting).

An engine can also go silent without ending: stopped (SIGSTOP, a debugger), or hung in a way
that takes the whole process. A third thread in the child sends a heartbeat (`Alive`) every
HEARTBEAT_S whatever the engine does (llama.cpp's calls release the GIL, so a long decode
does not hold it back); the parent's `recv` swallows them, and one that hears nothing at all
for `silence_s` kills the process and reports it dead, so it is restarted like a crashed one.

This module loads no native library in the parent: the service is imported in the child.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

from engine.llm.repack import note_exit
from engine.service.control import ThreadControl
from engine.service.protocol import (
    EXIT_UNREADABLE,
    AdoptCheckpoints,
    Alive,
    Crash,
    CrashKind,
    EngineDied,
    Event,
    GenerateRequest,
    Preempt,
    Request,
    Shutdown,
    Stop,
)

log = logging.getLogger(__name__)

# How long a clean shutdown may take (a stop lands within a chunk) before the process is killed.
SHUTDOWN_TIMEOUT_S = 10.0
# The child's heartbeat, and how long the parent waits without hearing anything (an event or
# a heartbeat) before it declares the engine dead: generous, for a machine that swaps.
HEARTBEAT_S = 1.0
SILENCE_S = 30.0
# Before the child's first word: starting a Python process and importing llama.cpp can take
# long on a loaded machine.
STARTUP_SILENCE_S = 120.0


class EngineProcess:
    """The parent's handle on one engine process. `send` and the control calls are safe
    from any thread; `recv` is for one reader (it blocks)."""

    def __init__(self, *, epoch: int = 0, log_file: Path | None = None,
                 silence_s: float | None = None) -> None:
        """`epoch`: the real-request count to go on from (a restart keeps it). `log_file`:
        the engine's stderr (its log, llama.cpp's own messages, a native crash's stack)
        goes there instead of this process's (a command line's one-line contract).
        `silence_s`: how long `recv` waits without a word from the engine before it kills
        it and reports it dead (SILENCE_S by default)."""
        context = multiprocessing.get_context("spawn")  # never fork a process with Qt threads
        ours, theirs = context.Pipe(duplex=True)
        self._conn: Connection = ours
        self._send_lock = threading.Lock()
        self._epoch = epoch
        self.log_file = log_file
        self.silence_s = SILENCE_S if silence_s is None else silence_s
        self._heard = False  # anything from the child yet
        self._last_heard = time.monotonic()
        self._pending: Event | None = None  # read by `poll`, not yet returned by `recv`
        self._process: BaseProcess = context.Process(
            target=child_main,
            args=(theirs, logging.getLogger().getEffectiveLevel(),
                  str(log_file) if log_file is not None else None),
            name="arbor-engine", daemon=True)
        self._process.start()
        theirs.close()  # the child's end lives in the child only: its death is our EOF
        self.closing = False
        if epoch:
            self.send_control(Preempt(epoch))

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def send(self, request: Request | Crash) -> bool:
        """Queue a request in the engine; False if the engine is gone (its death is
        reported by `recv`)."""
        try:
            with self._send_lock:
                if isinstance(request, AdoptCheckpoints):
                    self._send_checkpoints(request)
                else:
                    self._conn.send(request)
        except (OSError, ValueError):  # a broken pipe, or closed by shutdown
            return False
        return True

    def _send_checkpoints(self, request: AdoptCheckpoints) -> None:
        blobs = [bytes(c.blob or b"") for c in request.checkpoints]
        bare = tuple(replace(c, blob=None) for c in request.checkpoints)
        self._conn.send(replace(request, checkpoints=bare))
        for blob in blobs:
            self._conn.send_bytes(blob)

    def stop(self, request_id: int | None = None) -> None:
        """Stop the reply of `request_id` (running or queued), or (None) whatever runs."""
        self.send_control(Stop(request_id))

    def preempt(self) -> int:
        """A real request follows: warm-ups in flight become stale. Returns the new epoch."""
        with self._send_lock:
            self._epoch += 1
            epoch = self._epoch
        self.send_control(Preempt(epoch))
        return epoch

    def epoch(self) -> int:
        return self._epoch

    def send_control(self, message: Stop | Preempt | Shutdown) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError):
            pass  # gone: recv reports it

    def poll(self, timeout: float) -> bool:
        """Whether an event (or the engine's death) is there to `recv`, waiting up to
        `timeout` seconds. For the one reader, like `recv`."""
        deadline = time.monotonic() + timeout
        while self._pending is None:
            # Wait no longer than the silence allowed: a stopped engine sends nothing.
            wait = min(deadline - time.monotonic(),
                       self._allowed_silence() - self._silent_for())
            if self._wait(max(0.0, wait)):
                event = self._read()
                if not isinstance(event, Alive):
                    self._pending = event
                continue
            if self._silent_for() >= self._allowed_silence():
                self._pending = self._declare_silent()
                break
            if time.monotonic() >= deadline:
                return False
        return True

    def recv(self) -> Event:
        """The next event; `EngineDied` once the process has ended, or has said nothing
        (not even a heartbeat) for `silence_s` and was killed (and then always)."""
        while self._pending is None:
            self.poll(self._allowed_silence())
        event, self._pending = self._pending, None
        if isinstance(event, EngineDied):
            self._pending = event  # and then always
        return event

    def responsive(self) -> bool:
        """Whether the engine lives and has been heard from within `silence_s`, without
        waiting (an idle front end's check; for the one reader, like `recv`)."""
        self.poll(0)
        return not isinstance(self._pending, EngineDied)

    def _wait(self, timeout: float) -> bool:
        try:
            return self._conn.poll(timeout)
        except (EOFError, OSError, ValueError):
            return True  # closed: the read reports the death

    def _read(self) -> Event:
        try:
            event: Event = self._conn.recv()
        except (EOFError, OSError, ValueError):
            self._process.join(SHUTDOWN_TIMEOUT_S)
            code = self._process.exitcode
            return EngineDied(code, note_exit(self._process.pid, code))
        except Exception as exc:  # an event this side cannot unpickle: a bug, or a mismatch
            log.error("unreadable event from the engine (%s: %s); ending it",
                      type(exc).__name__, exc)
            self.kill()
            self._process.join()
            return EngineDied(self._process.exitcode)
        self._heard = True
        self._last_heard = time.monotonic()
        return event

    def _allowed_silence(self) -> float:
        return self.silence_s if self._heard else max(self.silence_s, STARTUP_SILENCE_S)

    def _silent_for(self) -> float:
        return time.monotonic() - self._last_heard

    def _declare_silent(self) -> EngineDied:
        silent = self._silent_for()
        log.error("the engine process said nothing for %.0f s; killing it", silent)
        self.kill()
        self._process.join()
        return EngineDied(self._process.exitcode, silent_s=silent)

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Ask the engine to stop and exit; kill it if it has not within `timeout`."""
        self.closing = True
        self.send_control(Stop())
        self.send_control(Shutdown())
        deadline = time.monotonic() + timeout
        while self._process.is_alive() and time.monotonic() < deadline:
            # join() can return early while a spawned child is still starting up.
            self._process.join(max(0.0, min(0.1, deadline - time.monotonic())))
        if self._process.is_alive():
            log.warning("the engine did not exit in %.0f s; killing it", timeout)
            self._process.kill()
            self._process.join()
        self._conn.close()

    def kill(self) -> None:
        """SIGKILL the engine (tests, and a front end that gives up on it)."""
        if self._process.is_alive():
            self._process.kill()


# --- the child ------------------------------------------------------------------------------

LOG_ROTATE_BYTES = 8 << 20


def _redirect_stderr(path: Path) -> None:
    """File descriptor 2 (Python's and the native code's) to `path`, appended; the file is
    rotated once it passes LOG_ROTATE_BYTES (one older file kept)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        return  # the log stays where it was
    os.dup2(fd, 2)
    os.close(fd)


def child_main(conn: Connection, log_level: int, log_file: str | None = None) -> None:
    """The engine process: a reader thread for messages, the main thread for requests."""
    import faulthandler

    if log_file is not None:
        _redirect_stderr(Path(log_file))
    logging.basicConfig(level=log_level, stream=sys.stderr,
                        format="arbor-engine %(levelname)s %(name)s: %(message)s")
    faulthandler.enable()  # a native crash leaves its stack in the log
    # Ctrl+C in a terminal reaches the whole process group: the parent decides when the
    # engine ends (Shutdown, or its end of the pipe closing), never the keyboard.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    send_lock = threading.Lock()

    def emit(event: Event | Alive) -> None:
        try:
            with send_lock:
                conn.send(event)
        except (OSError, ValueError):
            os._exit(0)  # the parent is gone: nobody to answer

    closing = threading.Event()
    # First, so that importing llama.cpp below is heard as alive.
    threading.Thread(target=_beat, args=(emit, closing), name="arbor-engine-heartbeat",
                     daemon=True).start()
    from engine.llm.llama import builtin_template_names, gpu_memory
    from engine.service.handler import EngineService
    from engine.service.protocol import EngineStarted

    control = ThreadControl()
    requests: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
    threading.Thread(target=_read, args=(conn, control, requests, closing),
                     name="arbor-engine-reader", daemon=True).start()
    service = EngineService(emit, control)
    emit(EngineStarted(os.getpid(), tuple(builtin_template_names()), gpu_memory()))
    while (request := requests.get()) is not None and not closing.is_set():
        service.handle(request)
    service.close()
    conn.close()


def _read(conn: Connection, control: ThreadControl,
          requests: queue.SimpleQueue[Request | None], closing: threading.Event) -> None:
    while True:
        try:
            message = conn.recv()
            if isinstance(message, AdoptCheckpoints):
                blobs = [conn.recv_bytes() for _ in message.checkpoints]
                message = replace(message, checkpoints=tuple(
                    replace(c, blob=blob) for c, blob in zip(message.checkpoints, blobs,
                                                            strict=True)))
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone (closed, or killed): so is the engine
        except Exception as exc:  # unpickling: a front end of another version, or a bug
            log.error("cannot read a message from the front end (%s: %s); ending",
                      type(exc).__name__, exc)
            sys.stderr.flush()
            os._exit(EXIT_UNREADABLE)  # its front end sees the death and starts another
        match message:
            case Stop():
                control.stop(message.request_id)
            case Preempt():
                control.set_epoch(message.epoch)
            case Shutdown():  # what runs stops, what is queued is dropped
                closing.set()
                control.stop()
                control.preempt()
                requests.put(None)
                return
            case Crash():
                if message.kind is CrashKind.KILL:
                    os.kill(os.getpid(), signal.SIGKILL)
                os.abort()
            case GenerateRequest():
                control.clear_stop()  # in order: a Stop for no reply in particular that
                # follows is for this one
                requests.put(message)
            case _:
                requests.put(message)


def _beat(emit: Callable[[Event | Alive], None], closing: threading.Event) -> None:
    """The heartbeat: one `Alive` every HEARTBEAT_S until the engine closes."""
    while not closing.wait(HEARTBEAT_S):
        emit(Alive())
