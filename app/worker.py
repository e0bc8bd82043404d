"""The engine thread: one EngineWorker on one QThread owns the runtime; nothing else touches
llama.cpp. Requests and results are immutable values (app.messages); the GUI thread owns the
tree and the store and never waits on the worker. Stop sets a thread-safe flag that the engine
checks between chunks, inside a chunk (llama.cpp's abort callback) and between tokens.

Warm-ups (preparing the likely next prompt while the user reads) run only when nothing else
is queued in practice: before the GUI thread sends a real request it bumps `epoch`, and a
warm-up whose epoch is stale stops within a chunk, so the real request waits at most that.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.messages import (
    AdoptCheckpoints,
    ExportDone,
    ExportRequest,
    Failed,
    GenerateRequest,
    LoadProgress,
    LoadRequest,
    ModelLoaded,
    Piece,
    Plan,
    Progress,
    ReplyDone,
    StoreUsage,
    Warmed,
    WarmRequest,
)
from engine.checkpoints import CheckpointStore
from engine.errors import ArborError, Cancelled
from engine.formats.native import SessionCheckpoint, write_session
from engine.generator import Generator
from engine.paths import data_dirs
from engine.runtime import Runtime, Source
from engine.settings import Effect, Settings, effect_of
from engine.tree import Node

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
    load_progress = Signal(object)  # LoadProgress
    usage = Signal(object)  # StoreUsage
    planned = Signal(object)  # Plan
    warmed = Signal(object)  # Warmed
    template_changed = Signal(str)  # the chat template for new messages, in words
    exported = Signal(object)  # ExportDone

    def __init__(self) -> None:
        super().__init__()
        self._generator: Generator | None = None
        self._stop = threading.Event()
        self._settings = Settings()
        self._path: str | None = None
        # Real requests sent so far; written by the GUI thread (an int store is atomic).
        self.epoch = 0
        self.engine_thread_ident: int | None = None

    def request_stop(self) -> None:
        """Thread-safe: called from the GUI thread while the worker is busy."""
        self._stop.set()

    def preempt(self) -> int:
        """Called on the GUI thread just before it sends a real request: any warm-up in
        flight or queued becomes stale. Returns the new epoch."""
        self.epoch += 1
        return self.epoch

    @Slot(object)
    def load(self, request: LoadRequest) -> None:
        self.engine_thread_ident = threading.get_ident()
        settings = request.settings

        shown = [-1.0]

        def on_load_progress(fraction: float) -> None:
            # llama.cpp reports every tensor (hundreds of calls): pass on whole percents.
            if fraction >= 1.0 or fraction - shown[0] >= 0.01:
                shown[0] = fraction
                self.load_progress.emit(LoadProgress(request.path, fraction))

        try:
            runtime = Runtime(
                Path(request.path), settings.runtime(), on_load_progress=on_load_progress
            )
        except ArborError as exc:
            self.load_failed.emit(str(exc))  # the previous model keeps working
            return
        except Exception as exc:  # a bug, not the file: still never leave the window waiting
            log.exception("loading %s failed", request.path)
            self.load_failed.emit(f"an internal error stopped the load ({type(exc).__name__})")
            return
        identity = runtime.identity()  # hashes the model file (cached, but once is enough)
        try:
            generator = Generator(
                runtime, sampling=settings.sampling(),
                checkpoints=CheckpointStore(
                    identity, ram_budget=settings.ram_budget(), disk_dir=self._disk_dir()
                ),
                checkpoint_interval=settings.checkpoint_interval,
                template=settings.template_for(request.path),
            )
        except ArborError as exc:  # a chat template Jinja or llama.cpp cannot use
            runtime.close()
            self.load_failed.emit(str(exc))  # the previous model keeps working
            return
        self._close()
        self._settings = settings
        self._path = request.path
        self._generator = generator
        self.loaded.emit(
            ModelLoaded(
                name=runtime.model.info.name,
                path=str(runtime.model.path),
                architecture=runtime.model.info.architecture,
                memory_kind=runtime.memory_kind.value,
                backend=runtime.backend,
                n_ctx=runtime.n_ctx,
                notices=tuple(runtime.notices),
                identity=identity,
                template=generator.template.describe(),
            )
        )
        self._emit_usage()

    @Slot(object)
    def configure(self, settings: Settings) -> None:
        """New settings: applied at once, or by loading the model again when the context
        has to change (the GUI thread has said so to the user before sending them)."""
        effect = effect_of(self._settings, settings)
        generator = self._generator
        if effect in (Effect.RELOAD, Effect.INVALIDATE) and self._path is not None:
            self.load(LoadRequest(self._path, settings))
            return
        previous, self._settings = self._settings, settings
        if generator is not None:
            generator.configure(sampling=settings.sampling(),
                                checkpoint_interval=settings.checkpoint_interval)
            if self._path is not None:
                chosen = settings.template_for(self._path)
                if chosen != previous.template_for(self._path):
                    generator.use_template(chosen)
                    self.template_changed.emit(generator.template.describe())
            if generator.checkpoints is not None:
                generator.checkpoints.configure(ram_budget=settings.ram_budget(),
                                                disk_dir=self._disk_dir())
            self._emit_usage()

    @Slot(object)
    def warm(self, request: WarmRequest) -> None:
        generator = self._generator
        if generator is None or request.epoch != self.epoch:
            return

        def stale() -> bool:
            return request.epoch != self.epoch

        path = [view.to_node() for view in request.path]
        untokenized = {node.id for node in path if node.tokens is None}
        try:
            report = generator.warm(path, cancel=stale)
        except Cancelled:
            log.debug("warm-up pre-empted")
            return
        except ArborError as exc:
            log.info("warm-up skipped: %s", exc)
            return
        except Exception:  # a warm-up is an optimisation: a bug in it must not cost a reply
            log.exception("warm-up failed")
            return
        self.warmed.emit(
            Warmed(
                conversation_id=request.conversation_id,
                last_node=request.path[-1].id,
                prompt_tokens=generator.runtime.canonical_tokens,
                decoded_tokens=report.decoded_tokens if report is not None else 0,
                prefill_ms=report.prefill_ms if report is not None else 0.0,
                node_tokens=_rendered(path, untokenized),
            )
        )
        if report is not None:
            generator.after_reply()
            self._emit_usage()

    @Slot(object)
    def generate(self, request: GenerateRequest) -> None:
        try:
            self._generate(request)
        except Exception as exc:  # a bug: report it, never leave the window waiting
            log.exception("the reply failed")
            self.errored.emit(self._failed(
                request, f"an internal error stopped the reply ({type(exc).__name__}); "
                "what was written is saved"))

    def _generate(self, request: GenerateRequest) -> None:
        generator = self._generator
        self._stop.clear()
        if generator is None:
            self.errored.emit(self._failed(request, "no model is loaded"))
            return
        path = [view.to_node() for view in request.path]
        resume = request.resume.to_node() if request.resume is not None else None
        untokenized = {node.id for node in path if node.tokens is None}

        def on_progress(done: int, total: int) -> None:
            self.progress.emit(Progress(request.request_id, done, total))

        def on_plan(prompt: int, reused: int, source: Source, position: int | None) -> None:
            self.planned.emit(Plan(request.request_id, prompt, reused, source.value, position))

        try:
            prepared = generator.prepare(
                path, resume=resume, on_progress=on_progress, on_plan=on_plan,
                cancel=self._stop.is_set,
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
            self.aborted.emit(self._failed(request, ""))
            return
        except ArborError as exc:
            self.errored.emit(self._failed(request, str(exc)))
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
                node_tokens=_rendered(path, untokenized),
                text=text,
                tokens=finished.tokens,
                meta=tuple(finished.meta().items()),
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
    def export_session(self, request: ExportRequest) -> None:
        """Write the session file here: the checkpoints live on this thread, and a file of
        a few hundred MiB should not hold the GUI. Only this conversation's checkpoints go
        (global node ids carry the conversation), read back from disk where spilled."""
        generator = self._generator
        items: list[SessionCheckpoint] = []
        if generator is not None and generator.checkpoints is not None:
            store = generator.checkpoints
            for checkpoint in store.all():
                node = checkpoint.node_id
                if node is None or node >> 32 != request.conversation_id:
                    continue
                loaded = store.fetch(checkpoint)
                if loaded is not None and loaded.blob is not None:
                    items.append(SessionCheckpoint(0, loaded, store.identity))
        try:
            write_session(Path(request.path), list(request.records), items)
        except (ArborError, OSError) as exc:
            message = exc.strerror if isinstance(exc, OSError) else str(exc)
            self.exported.emit(ExportDone(request.path, 0, f"it could not be written: {message}"))
            return
        self.exported.emit(ExportDone(request.path, len(items), None))

    @Slot(object)
    def adopt(self, request: AdoptCheckpoints) -> None:
        """Checkpoints from an imported session file: kept if they fit this context. Keyed
        by their tokens, they serve the imported conversation without any id mapping."""
        generator = self._generator
        store = generator.checkpoints if generator is not None else None
        if store is None or store.identity != request.identity:
            log.info("imported checkpoints do not fit the loaded model; not kept")
            return
        for checkpoint in request.checkpoints:
            store.add(replace(checkpoint, node_id=None))
        store.enforce_budget()
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

    def _disk_dir(self) -> Path | None:
        return data_dirs().cache / "checkpoints" if self._settings.disk_tier else None

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
    def _failed(request: GenerateRequest, message: str) -> Failed:
        return Failed(request.request_id, request.conversation_id, request.reply_id, message)


def _rendered(
    path: list[Node], untokenized: set[int]
) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The tokens the engine rendered for path nodes that had none: the window keeps them."""
    return tuple(
        (node.id, node.tokens) for node in path
        if node.id in untokenized and node.tokens is not None
    )
