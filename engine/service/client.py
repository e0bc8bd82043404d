"""A `Session` whose replies come from an engine process: `replay --engine-process`.

`RemoteReplier` speaks the same protocol as the window (`engine.service.protocol` over
`engine.service.process`), synchronously: it sends a request and reads events until its answer
comes. So the command line, the tests and the benchmarks run exactly the path the app runs,
and can compare it with the in-process one.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.config.params import SamplingParams
from engine.config.settings import Settings
from engine.core.errors import (
    Cancelled,
    EngineCrashed,
    KernelsCrashed,
    ModelLoadError,
)
from engine.core.overflow import Overflow
from engine.core.results import (
    NodeView,
    Rendered,
    ReplyFailure,
    ReplyReport,
    ReplyResult,
    Stopped,
)
from engine.core.tree import Node
from engine.files.paths import data_dirs
from engine.llm.reply import CancelFn, PieceFn, ProgressFn
from engine.service.process import SHUTDOWN_TIMEOUT_S, EngineProcess
from engine.service.protocol import (
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
    StoreUsage,
    Sync,
    Synced,
    Warmed,
    WarmRequest,
)

log = logging.getLogger(__name__)


def engine_log() -> Path:
    """Where a command line's engine process writes its log and llama.cpp's messages."""
    return data_dirs().cache / "engine.log"


class RemoteReplier:
    def __init__(self, process: EngineProcess | None = None) -> None:
        """Without `process`, a new engine whose stderr goes to `engine_log()` (the command
        line keeps its own stderr to one line per error)."""
        self.process = process or EngineProcess(log_file=engine_log())
        self.usage: StoreUsage | None = None  # the last checkpoint figures the engine sent
        self._ids = itertools.count(1)
        self._load: LoadRequest | None = None
        self._prompted = False  # a reply has run since the load

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
            return self._restart(self._load)

    def _restart(self, load: LoadRequest) -> ModelLoaded:
        """A new engine process (its log where the last one's went), `load` loaded."""
        self.process = EngineProcess(log_file=self.process.log_file)
        return self._send_load(load)

    def _send_load(self, request: LoadRequest) -> ModelLoaded:
        self.process.send(request)
        while True:
            match self._next():
                case ModelLoaded() as loaded:
                    return loaded
                case LoadFailed() as failed:
                    raise ModelLoadError(failed.message)
                case _:
                    pass

    def reply(self, path: Sequence[Node], *, resume: Node | None, max_tokens: int, seed: int,
              on_progress: ProgressFn | None = None, on_piece: PieceFn | None = None,
              cancel: CancelFn | None = None, sampling: SamplingParams | None = None,
              overflow: Overflow = Overflow.STOP, scope: str = "") -> ReplyResult:
        """`scope`: whose request it is (engine.service.protocol); only its cached state is
        reused."""
        first, self._prompted = not self._prompted, True

        def ask() -> ReplyResult:
            return self._reply(path, resume=resume, max_tokens=max_tokens, seed=seed,
                               on_progress=on_progress, on_piece=on_piece, cancel=cancel,
                               sampling=sampling, overflow=overflow, scope=scope)

        try:
            return ask()
        except KernelsCrashed as exc:
            if not first or self._load is None:
                raise
            log.warning("%s; loading the model again and asking again", exc)
            self._restart(self._load)
            return ask()

    def _reply(self, path: Sequence[Node], *, resume: Node | None, max_tokens: int, seed: int,
               on_progress: ProgressFn | None, on_piece: PieceFn | None,
               cancel: CancelFn | None, sampling: SamplingParams | None,
               overflow: Overflow, scope: str) -> ReplyResult:
        request_id = next(self._ids)
        self.process.preempt()
        self.process.send(GenerateRequest(
            request_id, 0, resume.id if resume is not None else -1,
            tuple(NodeView.of(node) for node in path),
            NodeView.of(resume) if resume is not None else None, max_tokens, seed, sampling,
            overflow, scope))
        stopped = False
        while True:
            if cancel is not None and not stopped and cancel():
                self.process.stop()
                stopped = True
            match self._next():
                case Piece() as piece if piece.request_id == request_id:
                    if on_piece is not None:
                        on_piece(piece.text)
                case Progress() as progress if progress.request_id == request_id:
                    if on_progress is not None:
                        on_progress(progress.done, progress.total)
                case Finished() as finished if finished.request_id == request_id:
                    match finished.outcome:
                        case ReplyResult() as result:
                            return result
                        case Stopped():
                            raise Cancelled()
                        case ReplyFailure() as failure:
                            raise failure.error()
                case _:
                    pass

    def warm(self, path: Sequence[Node], *, max_tokens: int = 512,
             overflow: Overflow = Overflow.STOP) -> tuple[ReplyReport | None, Rendered]:
        if not path:
            return None, ()
        self.process.send(WarmRequest(self.process.epoch(), 0,
                                      tuple(NodeView.of(node) for node in path), max_tokens,
                                      overflow))
        while True:
            match self._next():
                case Warmed() as warmed:
                    return warmed.report, warmed.rendered
                case _:
                    pass

    def warm_while(self, path: Sequence[Node], idle: Callable[[], bool],
                   poll_s: float = 0.05, *, scope: str = "") -> ReplyReport | None:
        """Prepare `path` for `scope` while `idle()` holds: what it did, or None if a request
        came first (the next `reply` makes the warm-up stale; it stops within a chunk)."""
        if not path:
            return None
        epoch = self.process.epoch()
        self.process.send(WarmRequest(epoch, 0, tuple(NodeView.of(node) for node in path),
                                      scope=scope))
        while idle():
            if not self.process.poll(poll_s):
                continue
            match self._next():
                case Warmed() as warmed:
                    return warmed.report if warmed.done else None
                case _:
                    pass
        return None

    def forget(self, node_ids: Sequence[int]) -> None:
        self.process.send(ForgetRequest(tuple(node_ids)))

    def store_report(self) -> dict[str, Any]:
        """The checkpoint store's figures as they are now (after every request sent)."""
        token = next(self._ids)
        self.process.send(Sync(token))
        while not (isinstance(event := self._next(), Synced) and event.token == token):
            pass
        return dict(self.usage.stats) if self.usage is not None else {}

    def responsive(self) -> bool:
        """Whether the engine process lives and answers (its heartbeat), without waiting."""
        return self.process.responsive()

    def close(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """End the engine process: asked to exit, killed after `timeout` seconds."""
        self.process.shutdown(timeout)

    def _next(self) -> Event:
        event = self.process.recv()
        if isinstance(event, EngineDied):
            crashed = KernelsCrashed if event.kernels_fallback else EngineCrashed
            raise crashed(f"the engine process ended: {event.describe()}")
        if isinstance(event, StoreUsage):
            self.usage = event
        return event
