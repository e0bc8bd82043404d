"""The local API inside the app: the same server as `arbor-engine serve`, on the window's own
trees and the window's own engine.

- Trees: API conversations are the window's conversations. Every tree operation of an API
  request (placing it, starting and finishing its reply) runs on the GUI thread, on the very
  `Conversation` object the window holds when it has that conversation open, so there is one
  tree in memory per conversation whoever changes it. The API's worker thread asks the GUI
  thread and waits; the GUI thread never waits on the worker.
- Engine: API replies go to the window's engine process with request ids of their own; their
  events are handed to the worker by the engine client (`EngineClient.run`, a tap by id).
  The window goes first: an API reply starts only while the window has none running, and
  a reply the window starts while an API reply runs stops that one (`Replies.claiming`):
  its client gets a 503 "the app's user needs the model", or, once its stream has begun,
  the stream ends with that error; what the stream had sent stays in its tree as an
  interrupted reply (engine.service.lifetime's policy). Each side stops only its own reply:
  a client that goes away never stops the window's, the user's Esc never the API's. An
  engine that dies under an API request, or before it is sent, answers it 503; the window
  restarts the engine and the API serves again once the model is loaded. The window warms
  its own branches; API replies are not warmed here.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from PySide6.QtCore import QObject, Signal, Slot

from app.state.controller import ChatController
from app.state.engine_client import ProcessEngine
from engine.api.schema import ApiError, ChatRequest
from engine.api.trees import ApiTrees
from engine.api.worker import ApiWorker, Begun
from engine.config.params import SamplingParams
from engine.config.settings import Settings
from engine.core.errors import Cancelled
from engine.core.results import (
    FailureKind,
    FinishReason,
    NodeView,
    Outcome,
    ReplyFailure,
    ReplyReport,
    ReplyResult,
    Stopped,
)
from engine.core.tree import Node
from engine.llm.reply import CancelFn, PieceFn
from engine.service.client import EngineClient, generate_request
from engine.service.protocol import ModelLoaded

if TYPE_CHECKING:
    from engine.api.server import Server

log = logging.getLogger(__name__)
T = TypeVar("T")
POLL_S = 0.05
API_REQUEST_IDS = 1 << 40  # the window's own request ids count up from 1
PREEMPTED = ("the app's user needs the model: this reply was stopped for theirs; try again "
             "once it is done")


class _OnGui(QObject):
    """Runs a function on the GUI thread for another thread, which waits for the result
    unless the API is closing."""

    _call = Signal(object)

    def __init__(self, closing: threading.Event) -> None:
        super().__init__()
        self._closing = closing
        self._call.connect(self._run)

    def __call__(self, fn: Callable[[], T]) -> T:
        future: Future[T] = Future()
        self._call.emit((fn, future))
        while True:
            try:
                return future.result(timeout=POLL_S)
            except FutureTimeout:
                if self._closing.is_set() and future.cancel():
                    raise ApiError(503, "the server is shutting down",
                                   type="server_error") from None

    @Slot(object)
    def _run(self, item: tuple[Callable[[], object], Future[object]]) -> None:
        fn, future = item
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)


class WindowTrees:
    """The API's `TreeSide` in the app: `ApiTrees` over the window's store and open
    conversations, every call made on the GUI thread."""

    def __init__(self, controller: ChatController, on_gui: _OnGui) -> None:
        self._on_gui = on_gui
        self._trees = ApiTrees(controller.store, opened=controller.conversations.get,
                               saved=lambda cid: _shown(controller, cid))

    def begin(self, request: ChatRequest, model: str, base_seed: int | None) -> Begun:
        return self._on_gui(lambda: self._trees.begin(request, model, base_seed))

    def finish(self, begun: Begun, outcome: Outcome, streamed: str, cut: str | None
               ) -> list[Node]:
        return self._on_gui(lambda: self._trees.finish(begun, outcome, streamed, cut))

    def close(self) -> None:
        pass  # the store is the window's


def _shown(controller: ChatController, conversation_id: int) -> None:
    """An API write: the sidebar lists it, and the open conversation shows it."""
    controller.listed.emit()
    if controller.current == conversation_id:
        controller.changed.emit()


class WindowEngine:
    """The API's `EngineSide` in the app: the window's engine process, the window first."""

    def __init__(self, controller: ChatController, engine: EngineClient,
                 closing: threading.Event) -> None:
        self._controller = controller
        self._replies = controller.replies
        self._engine = engine
        self._closing = closing
        self._ids = itertools.count(API_REQUEST_IDS)
        # The API's reply in flight, if any, and whether the window took the engine from it.
        self._lock = threading.Lock()
        self._running: int | None = None
        self._preempted = False

    def yield_to_window(self) -> None:
        """On the GUI thread, just before the window sends a reply: an API reply in flight
        stops (within a token), so the window's does not wait for it."""
        with self._lock:
            if self._running is None:
                return
            self._preempted = True
            request_id = self._running
        self._engine.stop(request_id)

    def loaded(self) -> ModelLoaded | None:
        return self._replies.model

    def sampling(self) -> SamplingParams:
        return self._controller.settings.sampling()

    def base_seed(self) -> int | None:
        return self._controller.settings.seed

    def wait_turn(self, cancel: CancelFn) -> None:
        """The window's reply goes first: an API request is placed in its tree and run only
        while the window has none running."""
        while self._replies.streaming is not None:
            if cancel() or self._closing.is_set():
                raise Cancelled()
            time.sleep(POLL_S)

    def reply(self, path: Sequence[Node], *, max_tokens: int, seed: int, on_piece: PieceFn,
              cancel: CancelFn, sampling: SamplingParams, scope: str,
              conversation_id: int, resume: Node | None = None) -> Outcome:
        if self._replies.model is None:  # died and restarted since `loaded`: reloading
            return ReplyFailure(FailureKind.ENGINE_DIED, "the engine process ended")
        request_id = next(self._ids)
        with self._lock:
            self._running, self._preempted = request_id, False
        try:
            outcome = self._engine.run(generate_request(
                request_id, [NodeView.of(node) for node in path],
                resume=NodeView.of(resume) if resume is not None else None,
                max_tokens=max_tokens, seed=seed, sampling=sampling, scope=scope,
                conversation_id=conversation_id,
            ), on_piece=on_piece, cancel=cancel, abandon=self._closing.is_set)
        finally:
            with self._lock:
                self._running = None
        stopped = isinstance(outcome, Stopped) or (
            isinstance(outcome, ReplyResult) and outcome.finish is FinishReason.CANCELLED)
        if self._preempted and stopped:  # stopped for the window's reply
            return ReplyFailure(FailureKind.PREEMPTED, PREEMPTED)
        return outcome

    def warm_while(self, path: Sequence[Node], idle: Callable[[], bool], scope: str
                   ) -> ReplyReport | None:
        return None  # the window warms its own branches

    def recover(self) -> None:
        pass  # the window restarts its engine and reloads the model

    def check(self) -> None:
        pass  # the window watches its own engine process (Replies restarts it)

    def close(self) -> None:
        pass


class AppApi(QObject):
    """The "Local API server" setting: a server while it is on, on 127.0.0.1."""

    changed = Signal()  # started, stopped or failed: `url` and `problem` say which

    def __init__(self, controller: ChatController, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.url: str | None = None
        self.problem: str | None = None
        self._wanted: tuple[bool, int, str] | None = None
        self._closing = threading.Event()
        self._worker: ApiWorker | None = None
        self._server: Server | None = None
        self._engine: WindowEngine | None = None

    def apply(self, settings: Settings) -> None:
        """Start, stop or restart the server to match the settings."""
        wanted = (settings.api_server, settings.api_port, settings.api_key)
        if wanted == self._wanted:
            return
        self.stop()
        self._wanted = wanted
        if settings.api_server:
            self._start(settings)
        self.changed.emit()

    def _start(self, settings: Settings) -> None:
        from engine.api.server import Server, ServerOptions  # the HTTP stack, when it is on

        engine = self.controller.replies.engine
        if not isinstance(engine, ProcessEngine):
            self.problem = "the local API needs the engine process"
            return
        self._closing = threading.Event()
        on_gui = _OnGui(self._closing)
        on_gui.setParent(self)
        window_engine = WindowEngine(self.controller, engine.client, self._closing)
        worker = ApiWorker(lambda: WindowTrees(self.controller, on_gui), window_engine)
        worker.start()
        try:
            server = Server(worker, self._model_id, ServerOptions(
                port=settings.api_port, api_key=settings.api_key or None))
        except OSError as exc:
            worker.close()
            self.problem = f"port {settings.api_port} cannot be used ({exc.strerror or exc})"
            log.warning("local API: %s", self.problem)
            return
        server.start()
        self._worker, self._server = worker, server
        self._engine = window_engine
        self.controller.replies.claiming.connect(window_engine.yield_to_window)
        self.url, self.problem = server.url, None

    def stop(self) -> None:
        self._closing.set()
        window_engine, self._engine = self._engine, None
        if window_engine is not None:
            self.controller.replies.claiming.disconnect(window_engine.yield_to_window)
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()
        self.url = None
        self._wanted = None

    def _model_id(self) -> str:
        model = self.controller.replies.model
        return Path(model.path).stem if model is not None else ""
