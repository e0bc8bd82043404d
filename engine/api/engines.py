"""`arbor-engine serve`'s engine side: llama.cpp in a process of its own, reloaded if it dies."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.config.params import SamplingParams
from engine.config.settings import Settings
from engine.core.errors import ArborError
from engine.core.results import NodeView, Outcome, ReplyReport
from engine.core.tree import Node
from engine.llm.reply import CancelFn, PieceFn
from engine.service.client import ClientKind, EngineClient, engine_log, generate_request
from engine.service.process import SHUTDOWN_TIMEOUT_S
from engine.service.protocol import ModelLoaded

log = logging.getLogger(__name__)


class OwnEngine:
    """An `EngineSide` with an engine process of its own (see engine.api.worker)."""

    def __init__(self, model: Path, settings: Settings,
                 replier: Callable[[], EngineClient] | None = None) -> None:
        """Loads the model; raises ArborError if it cannot."""
        self.model = model
        self.settings = settings
        self._new_replier = replier or (
            lambda: EngineClient.make(ClientKind.PROCESS, log_file=engine_log()))
        self._replier: EngineClient | None = None
        self._loaded: ModelLoaded | None = None
        self._closed = False
        self._load()

    def loaded(self) -> ModelLoaded | None:
        return self._loaded

    def wait_turn(self, cancel: CancelFn) -> None:
        pass  # the engine is this server's alone

    def sampling(self) -> SamplingParams:
        return self.settings.sampling()

    def base_seed(self) -> int | None:
        return self.settings.seed

    def reply(self, path: Sequence[Node], *, max_tokens: int, seed: int, on_piece: PieceFn,
              cancel: CancelFn, sampling: SamplingParams, scope: str,
              conversation_id: int, resume: Node | None = None) -> Outcome:
        client = self._replier
        assert client is not None
        return client.reply(generate_request(
            client.next_id(), [NodeView.of(node) for node in path],
                resume=NodeView.of(resume) if resume is not None else None,
            max_tokens=max_tokens, seed=seed, sampling=sampling, scope=scope,
            conversation_id=conversation_id), on_piece=on_piece, cancel=cancel)

    def warm_while(self, path: Sequence[Node], idle: Callable[[], bool], scope: str
                   ) -> ReplyReport | None:
        if self._replier is None:
            return None
        return self._replier.warm(path, idle=idle, scope=scope)[0]

    def recover(self) -> None:
        """A new engine process with the same model (if it loads); none once closed (the
        server is ending, and its engine's end is what the request saw)."""
        if self._closed:
            return
        self._end(SHUTDOWN_TIMEOUT_S)
        try:
            self._load()
        except ArborError as exc:
            log.error("the engine could not be started again: %s", exc)

    def check(self) -> None:
        if self._replier is not None and not self._replier.responsive():
            log.error("the engine process ended or stopped answering; starting it again")
            self.recover()

    def close(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """End the engine: asked to exit, killed after `timeout` seconds."""
        self._closed = True
        self._end(timeout)

    def _end(self, timeout: float) -> None:
        replier, self._replier, self._loaded = self._replier, None, None
        if replier is not None:
            replier.close(timeout)

    def _load(self) -> None:
        replier = self._new_replier()
        try:
            self._loaded = replier.load(str(self.model), settings=self.settings)
        except BaseException:
            replier.close()
            raise
        self._replier = replier
