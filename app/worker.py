"""The engine thread: one EngineWorker on one QThread owns the runtime; nothing else touches
llama.cpp. Requests and results are immutable values (app.messages); the GUI thread owns the
tree and the store and never waits on the worker. Stop sets a thread-safe flag that the engine
checks between chunks, inside a chunk (llama.cpp's abort callback) and between tokens.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.messages import (
    Failed,
    GenerateRequest,
    LoadRequest,
    ModelLoaded,
    Piece,
    Progress,
    ReplyDone,
    StoreUsage,
)
from engine.checkpoints import CheckpointStore
from engine.errors import ArborError, Cancelled
from engine.generator import Generator
from engine.llama import SamplingParams
from engine.paths import data_dirs
from engine.runtime import Runtime, RuntimeSettings

log = logging.getLogger(__name__)


class EngineWorker(QObject):
    """Lives on the engine thread. Signals speak superqt's vocabulary."""

    loaded = Signal(object)  # ModelLoaded
    progress = Signal(object)  # Progress
    yielded = Signal(object)  # Piece
    returned = Signal(object)  # ReplyDone
    aborted = Signal(object)  # Failed (cancelled)
    errored = Signal(object)  # Failed
    load_failed = Signal(str)
    usage = Signal(object)  # StoreUsage

    def __init__(self, sampling: SamplingParams | None = None) -> None:
        super().__init__()
        self._generator: Generator | None = None
        self._stop = threading.Event()
        self._sampling = sampling or SamplingParams()
        self.engine_thread_ident: int | None = None

    def request_stop(self) -> None:
        """Thread-safe: called from the GUI thread while the worker is busy."""
        self._stop.set()

    @Slot(object)
    def load(self, request: LoadRequest) -> None:
        self.engine_thread_ident = threading.get_ident()
        try:
            runtime = Runtime(
                Path(request.path),
                RuntimeSettings(n_ctx=request.n_ctx, n_gpu_layers=request.n_gpu_layers),
            )
        except ArborError as exc:
            self.load_failed.emit(str(exc))  # the previous model keeps working
            return
        self._close()
        checkpoints = CheckpointStore(
            runtime.identity(), disk_dir=data_dirs().cache / "checkpoints"
        )
        self._generator = Generator(runtime, sampling=self._sampling, checkpoints=checkpoints)
        self.loaded.emit(
            ModelLoaded(
                name=runtime.model.info.name,
                path=str(runtime.model.path),
                architecture=runtime.model.info.architecture,
                memory_kind=runtime.memory_kind.value,
                backend=runtime.backend,
                n_ctx=runtime.n_ctx,
                notices=tuple(runtime.notices),
            )
        )
        self._emit_usage()

    @Slot(object)
    def generate(self, request: GenerateRequest) -> None:
        generator = self._generator
        self._stop.clear()
        if generator is None:
            self.errored.emit(self._failed(request, "no model is loaded", cancelled=False))
            return
        path = [view.to_node() for view in request.path]
        resume = request.resume.to_node() if request.resume is not None else None
        untokenized = {node.id for node in path if node.tokens is None}

        def on_progress(done: int, total: int) -> None:
            self.progress.emit(Progress(request.request_id, done, total, 0))

        try:
            prepared = generator.prepare(
                path, resume=resume, on_progress=on_progress, cancel=self._stop.is_set
            )
            generation = generator.generate(
                max_tokens=request.max_tokens,
                seed=request.seed,
                on_token=lambda _token, piece: self.yielded.emit(
                    Piece(request.request_id, request.conversation_id, request.reply_id, piece)
                ),
                cancel=self._stop.is_set,
            )
        except Cancelled:
            self.aborted.emit(self._failed(request, "", cancelled=True))
            return
        except ArborError as exc:
            self.errored.emit(self._failed(request, str(exc), cancelled=False))
            return
        generated = [*prepared.before, *generation.tokens]
        text = prepared.base_text + generation.text
        finished = generator.reply_tokens(path, generated, text)
        report = prepared.report
        self.returned.emit(
            ReplyDone(
                request_id=request.request_id,
                conversation_id=request.conversation_id,
                reply_id=request.reply_id,
                node_tokens=tuple(
                    (node.id, node.tokens) for node in path
                    if node.id in untokenized and node.tokens is not None
                ),
                text=text,
                tokens=finished.tokens,
                open_len=finished.open_len,
                finish=generation.finish.value,
                prompt_tokens=report.prompt_tokens,
                reused_tokens=report.reused_tokens,
                decoded_tokens=report.decoded_tokens,
                source=report.source.value,
                checkpoint_pos=report.checkpoint_pos,
                prefill_ms=report.prefill_ms,
                ttft_ms=(report.prefill_ms + generation.ttft_ms)
                if generation.ttft_ms is not None else None,
                generated_tokens=len(generation.tokens),
                decode_ms=generation.decode_ms,
            )
        )
        generator.after_reply()
        self._emit_usage()

    @Slot(object)
    def forget(self, node_ids: tuple[int, ...]) -> None:
        """Deleted branches: free their checkpoints."""
        if self._generator is not None:
            self._generator.forget(node_ids)
            self._emit_usage()

    @Slot()
    def shutdown(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._generator is not None:
            self._generator.runtime.close()
            self._generator = None

    def _emit_usage(self) -> None:
        store = self._generator.checkpoints if self._generator is not None else None
        if store is None:
            return
        stats = store.stats()
        self.usage.emit(
            StoreUsage(
                count=stats.count, ram_bytes=stats.ram_bytes, disk_bytes=stats.disk_bytes,
                ram_budget=stats.ram_budget,
                nodes=tuple(sorted(store.nodes_with_checkpoints().items())),
            )
        )

    @staticmethod
    def _failed(request: GenerateRequest, message: str, *, cancelled: bool) -> Failed:
        return Failed(request.request_id, request.conversation_id, request.reply_id, message,
                      cancelled)
