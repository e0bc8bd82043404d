"""The one door to the engine: `EngineClient`, of two kinds.

Every front end (the window, the command line, the local API) sends protocol requests
(`engine.service.protocol`) and reads protocol events through an `EngineClient`:

- `ClientKind.PROCESS`: the engine service in a process of its own (`engine.service.process`):
  llama.cpp can abort its process, and only that one goes. A reader thread takes its events.
- `ClientKind.IN_PROCESS`: a request handler on a thread of this process: a `Session` on a
  runtime it was given, the benchmark's baseline, and a scripted fake engine in tests (any
  object whose `handle(request)` reports events through the `emit` it was made with).

Events are delivered on the reader (or engine) thread: those of a request someone `tap`s go
to that tap, every other one to the `listen`er (the window's Qt adapter, app.state). An
engine death reaches every tap and the listener. On top of that, written once for every
front end: `run` (send a reply, stream its events, return its `Outcome`) and `call` (send a
request, wait for its answer), with which the command line and the API block on the engine.

This module loads no native library: the engine service is imported only where it runs.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from engine.config.params import SamplingParams
from engine.config.settings import Settings
from engine.core.errors import Cancelled, KernelsCrashed, ModelLoadError
from engine.core.overflow import Overflow
from engine.core.results import (
    FailureKind,
    NodeView,
    Outcome,
    Rendered,
    ReplyFailure,
    ReplyReport,
    ReplyResult,
    Stopped,
)
from engine.core.tree import Node
from engine.files.paths import data_dirs
from engine.llm.reply import CancelFn, PieceFn, ProgressFn
from engine.service.control import Control, ThreadControl
from engine.service.process import SHUTDOWN_TIMEOUT_S, EngineProcess
from engine.service.protocol import (
    CheckpointUsage,
    ConfigureRequest,
    Crash,
    Emit,
    EngineDied,
    EngineOptions,
    Event,
    Finished,
    ForgetRequest,
    GenerateRequest,
    LoadFailed,
    LoadRequest,
    ModelLoaded,
    Piece,
    Progress,
    Request,
    Sync,
    Synced,
    Warmed,
    WarmRequest,
)

log = logging.getLogger(__name__)

Receive = Callable[[Event], None]
POLL_S = 0.05  # how often a blocked caller looks at its `cancel`
# Requests a user waits for: they make any warm-up in flight or queued stale.
PREEMPTING = (GenerateRequest, LoadRequest, ConfigureRequest)


class ClientKind(StrEnum):
    IN_PROCESS = "in_process"
    PROCESS = "process"


class Handler(Protocol):
    """The engine side of an in-process client: `EngineService`, or a fake of it. It runs
    each request to the end and reports through the `emit` it was made with (a reply's last
    event is its `Finished`); a `close()` method, if it has one, is called on the engine
    thread when the client shuts down."""

    def handle(self, request: Request) -> None: ...


HandlerFactory = Callable[[Emit, Control], Handler]


def engine_log() -> Path:
    """Where a command line's engine process writes its log and llama.cpp's messages."""
    return data_dirs().cache / "engine.log"


def died(event: EngineDied) -> ReplyFailure:
    """A request's outcome when the engine ended under it."""
    kind = FailureKind.KERNELS if event.kernels_fallback else FailureKind.ENGINE_DIED
    return ReplyFailure(kind, f"the engine process ended: {event.describe()}")


class EngineClient:
    """Requests out, events back; see the module's docstring. `send`, `stop`, `preempt` and
    `tap` are safe from any thread; `run` and `call` block the calling thread."""

    def __init__(self) -> None:
        self.usage: CheckpointUsage | None = None  # the last checkpoint figures the engine sent
        self._listener: Receive | None = None
        self._taps: dict[int, Receive] = {}
        # The engine's death once handed to the taps: a tap made later gets it at once (its
        # request would go to a dead engine). The lock makes "handed" and "made" one order.
        self._died: EngineDied | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._load: LoadRequest | None = None
        self._prompted = False  # a reply has run since the last load

    @staticmethod
    def make(kind: ClientKind, *, handler: HandlerFactory | None = None,
             keep_thread: bool = True, log_file: Path | None = None,
             process: EngineProcess | None = None) -> EngineClient:
        """A client of `kind`. In process: `handler` (the engine service by default) is made
        on the engine thread's behalf with the client's emit and control (see
        `InProcessClient` for `keep_thread`). In a process: `process` (a new one by default),
        whose stderr goes to `log_file`."""
        if kind is ClientKind.IN_PROCESS:
            return InProcessClient(handler, keep_thread=keep_thread)
        return ProcessClient(process, log_file=log_file)

    # --- the kind's -------------------------------------------------------------------------

    def send(self, request: Request | Crash) -> None:
        """Queue a request; one a user waits for pre-empts warm-ups first."""
        raise NotImplementedError

    def stop(self, request_id: int | None = None) -> None:
        """Stop the reply of `request_id`, running or queued (within a chunk or a token), and
        no other: the window and the local API each stop their own. None: whatever runs."""
        raise NotImplementedError

    def preempt(self) -> int:
        """Make any warm-up in flight or queued stale; the new epoch."""
        raise NotImplementedError

    def epoch(self) -> int:
        """Real requests sent so far (a warm-up carries it; a newer one makes it stale)."""
        raise NotImplementedError

    def restart(self) -> None:
        """A new engine after one died (nothing loaded)."""
        raise NotImplementedError

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Stop whatever runs, free the model, end the engine."""
        raise NotImplementedError

    @property
    def running(self) -> bool:
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return None

    def kill(self) -> None:
        """End the engine at once (tests)."""

    def responsive(self) -> bool:
        """Whether the engine lives and answers, without waiting."""
        return self.running and self._died is None

    # --- events ------------------------------------------------------------------------------

    def listen(self, receive: Receive | None) -> None:
        """Where events no tap takes go (on the reader or engine thread)."""
        self._listener = receive

    def tap(self, request_id: int, receive: Receive | None) -> None:
        """Hand the events of `request_id` to `receive` (None ends it). A tap made after the
        engine died gets that death at once, on the calling thread."""
        with self._lock:
            if receive is None:
                self._taps.pop(request_id, None)
                return
            self._taps[request_id] = receive
            dead = self._died
        if dead is not None:
            receive(dead)

    def _dispatch(self, event: Event) -> None:
        """Every event, in order, from the kind's reader or engine thread."""
        if isinstance(event, CheckpointUsage):
            self.usage = event
        if isinstance(event, EngineDied):
            with self._lock:
                self._died = event
                taps = list(self._taps.values())
            for tap in taps:
                tap(event)
            if self.running:  # a death the client did not ask for
                self._deliver(event)
            return
        request_id = getattr(event, "request_id", None)
        receive = self._taps.get(request_id) if isinstance(request_id, int) else None
        if receive is not None:
            receive(event)
        else:
            self._deliver(event)

    def _deliver(self, event: Event) -> None:
        listener = self._listener
        if listener is not None:
            listener(event)

    # --- blocking: the command line's and the API's ------------------------------------------

    def run(self, request: GenerateRequest, *, on_piece: PieceFn | None = None,
            on_progress: ProgressFn | None = None, cancel: CancelFn | None = None,
            abandon: CancelFn | None = None) -> Outcome:
        """Send a reply and stream it until it ends: its outcome. `cancel` stops it (the
        engine says how it ended); `abandon` stops it and returns `Stopped` at once (the
        caller is closing and will not wait for an engine that may not answer)."""
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.tap(request.request_id, events.put)  # a dead engine's death comes at once
        sent = ended = stopped = False
        try:
            self.send(request)
            sent = True
            while True:
                if abandon is not None and abandon():
                    return Stopped()
                if cancel is not None and not stopped and cancel():
                    self.stop(request.request_id)  # this reply's alone
                    stopped = True
                try:
                    event = events.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                match event:
                    case Piece():
                        if on_piece is not None:
                            on_piece(event.text)
                    case Progress():
                        if on_progress is not None:
                            on_progress(event.done, event.total)
                    case Finished():
                        ended = True
                        return event.outcome
                    case EngineDied():
                        ended = True
                        return died(event)
                    case _:
                        pass
        finally:
            if sent and not ended:  # abandoned, or a callback raised: never leave it running
                self.stop(request.request_id)
            self.tap(request.request_id, None)

    def call(self, request: Request, answer: Callable[[Event], bool],
             idle: Callable[[], bool] | None = None) -> Event | None:
        """Send `request` and return the first event that `answer`s it, from events
        no tap takes (a client with no other listener: the command line's). With `idle`,
        give up (None) as soon as it is False. An engine death raises EngineCrashed."""
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        previous, self._listener = self._listener, events.put
        try:
            with self._lock:
                dead = self._died
            if dead is not None:
                events.put(dead)
            self.send(request)
            while idle is None or idle():
                try:
                    event = events.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if isinstance(event, EngineDied):
                    raise died(event).error()
                if answer(event):
                    return event
            return None
        finally:
            self._listener = previous

    def load(self, path: str, options: EngineOptions | None = None, *,
             settings: Settings | None = None) -> ModelLoaded:
        """Load with the command line's `options`, or the app's `settings`. An engine whose
        fast kernels crash on this CPU is started again once, without them."""
        self._load = LoadRequest(path, settings or Settings(), options)
        self._prompted = False
        try:
            return self._send_load(self._load)
        except KernelsCrashed as exc:
            log.warning("%s; starting it again", exc)
            self.restart()
            return self._send_load(self._load)

    def _send_load(self, request: LoadRequest) -> ModelLoaded:
        answer = self.call(request, lambda e: isinstance(e, ModelLoaded | LoadFailed))
        if isinstance(answer, LoadFailed):
            raise ModelLoadError(answer.message)
        assert isinstance(answer, ModelLoaded)
        return answer

    def reply(self, request: GenerateRequest, *, on_piece: PieceFn | None = None,
              on_progress: ProgressFn | None = None, cancel: CancelFn | None = None
              ) -> Outcome:
        """`run`, and once more after a reload when the model's first prompt crashed the
        engine's fast kernels (the next engine loads without them)."""
        first, self._prompted = not self._prompted, True
        outcome = self.run(request, on_piece=on_piece, on_progress=on_progress, cancel=cancel)
        if (isinstance(outcome, ReplyFailure) and outcome.kind is FailureKind.KERNELS
                and first and self._load is not None):
            log.warning("%s; loading the model again and asking again", outcome.message)
            self.restart()
            self._send_load(self._load)
            outcome = self.run(request, on_piece=on_piece, on_progress=on_progress,
                               cancel=cancel)
        return outcome

    def next_id(self) -> int:
        return next(self._ids)

    def warm(self, path: Sequence[Node], *, resume: Node | None = None, max_tokens: int = 512,
             overflow: Overflow = Overflow.STOP, conversation_id: int = 0,
             idle: Callable[[], bool] | None = None, scope: str = ""
             ) -> tuple[ReplyReport | None, Rendered]:
        """Prepare `path` for `scope` (with `resume`, the prompt that continues that reply
        to path[-1]; see Generator.warm): what it did, and the tokens it rendered. With
        `idle`, only while it holds (a request that comes first makes the warm-up stale; it
        stops within a chunk)."""
        if not path:
            return None, ()
        warmed = self.call(WarmRequest(
            self.epoch(), conversation_id, tuple(NodeView.of(node) for node in path),
            max_tokens, overflow, scope, NodeView.of(resume) if resume is not None else None),
            lambda e: isinstance(e, Warmed), idle)
        if not isinstance(warmed, Warmed) or not warmed.done:
            return None, ()
        return warmed.report, warmed.rendered

    def forget(self, node_ids: Sequence[int], conversation_id: int = 0) -> None:
        """Free the checkpoints of deleted nodes; returns once they are freed."""
        self.send(ForgetRequest(conversation_id, tuple(node_ids)))
        self.sync()

    def sync(self) -> None:
        """Return once every request sent before is done."""
        token = self.next_id()
        self.call(Sync(token), lambda e: isinstance(e, Synced) and e.token == token)

    def store_report(self) -> dict[str, Any]:
        """The checkpoint store's figures as they are now (after every request sent)."""
        self.sync()
        return dict(self.usage.stats) if self.usage is not None else {}

    def close(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        self.shutdown(timeout)


class InProcessClient(EngineClient):
    """The engine on a thread of this process. A crash in llama.cpp takes the process.

    With `keep_thread` (the window's), one thread runs every request and frees the model
    (the handler's `close`) when the client shuts down. Without it (a `Session` on a runtime
    it was given and does not own), a thread runs only while requests are queued: an idle
    client holds no thread, so a session dropped is a session freed, its runtime untouched."""

    def __init__(self, handler: HandlerFactory | None = None, *,
                 keep_thread: bool = True) -> None:
        super().__init__()
        self.control = ThreadControl()
        if handler is None:
            from engine.service.handler import EngineService  # loads llama.cpp

            handler = EngineService
        self._handler = handler(self._dispatch, self.control)
        self._keep_thread = keep_thread
        self._requests: deque[Request] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None  # serving, while it runs
        self.thread_ident: int | None = None  # the thread the engine runs on (the last)
        if keep_thread:
            with self._wake:
                self._serve_soon()

    def _serve_soon(self) -> None:
        """A thread to run what is queued (called holding `_wake`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="arbor-engine",
                                            daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        self.thread_ident = threading.get_ident()
        while True:
            with self._wake:
                while not self._requests and self._keep_thread and not self._closing:
                    self._wake.wait()
                if not self._requests:
                    self._thread = None
                    break
                request = self._requests.popleft()
            self._handler.handle(request)
        close = getattr(self._handler, "close", None)
        if self._keep_thread and close is not None:
            close()  # on the engine's own thread

    @property
    def running(self) -> bool:
        return not self._closing

    def send(self, request: Request | Crash) -> None:
        if self._closing or isinstance(request, Crash):
            return
        if isinstance(request, PREEMPTING):
            self.control.preempt()
        if isinstance(request, GenerateRequest):
            self.control.clear_stop()  # a stop for no reply in particular was for an earlier one
        with self._wake:
            self._requests.append(request)
            self._serve_soon()
            self._wake.notify()

    def stop(self, request_id: int | None = None) -> None:
        self.control.stop(request_id)

    def preempt(self) -> int:
        return self.control.preempt()

    def epoch(self) -> int:
        return self.control.epoch()

    def restart(self) -> None:
        raise RuntimeError("an engine thread does not die: it takes the process with it")

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Stop whatever runs, free the model on its own thread, end the thread."""
        if self._closing:
            return
        self.control.stop()
        self.control.preempt()
        with self._wake:
            self._closing = True
            thread = self._thread
            self._wake.notify()
        if thread is not None:
            thread.join()


class ProcessClient(EngineClient):
    """The engine in a process of its own (`engine.service.process`), restarted on demand."""

    def __init__(self, process: EngineProcess | None = None, *,
                 log_file: Path | None = None) -> None:
        super().__init__()
        self._log_file = log_file
        self._process: EngineProcess | None = None
        self._start(process or EngineProcess(log_file=log_file))

    def _start(self, process: EngineProcess) -> None:
        with self._lock:
            self._process, self._died = process, None
        threading.Thread(target=self._pump, args=(process,), name="arbor-engine-events",
                         daemon=True).start()

    def _pump(self, process: EngineProcess) -> None:
        """The reader thread: every event of `process`, in order, until its death."""
        while True:
            event = process.recv()
            if process is not self._process:
                return  # replaced: its death is no news
            self._dispatch(event)
            if isinstance(event, EngineDied):
                return

    @property
    def process(self) -> EngineProcess | None:
        return self._process

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and not self._process.closing

    def restart(self) -> None:
        # The count goes on: a warm-up sent before the crash stays stale.
        old = self._process
        if old is not None and not old.closing:
            old.closing = True  # its death, if it is not dead yet, is no news
            old.kill()
        self._start(EngineProcess(epoch=old.epoch() if old else 0, log_file=self._log_file))

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

    def preempt(self) -> int:
        return self._process.preempt() if self._process is not None else 0

    def epoch(self) -> int:
        return self._process.epoch() if self._process is not None else 0

    def kill(self) -> None:
        """SIGKILL the engine process (tests)."""
        if self._process is not None:
            self._process.kill()

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """End the engine process: asked to exit, killed after `timeout` seconds."""
        if self._process is not None and not self._process.closing:
            self._process.shutdown(timeout)


def generate_request(request_id: int, path: Sequence[NodeView], *, resume: NodeView | None,
                     max_tokens: int, seed: int, conversation_id: int = 0,
                     sampling: SamplingParams | None = None,
                     overflow: Overflow = Overflow.STOP, scope: str = "") -> GenerateRequest:
    """A reply request (the reply's id is the resumed node's, or -1 for a new one)."""
    return GenerateRequest(request_id, conversation_id,
                           resume.id if resume is not None else -1, tuple(path), resume,
                           max_tokens, seed, sampling, overflow, scope)


def outcome_result(outcome: Outcome) -> ReplyResult:
    """A blocking caller's view: the result, or the outcome's exception raised."""
    if isinstance(outcome, ReplyResult):
        return outcome
    if isinstance(outcome, Stopped):
        raise Cancelled()
    raise outcome.error()
