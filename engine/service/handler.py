"""The engine service: the one owner of llama.cpp, taking requests and reporting events.

`EngineService.handle(request)` runs one request (`engine.service.protocol`) to the end on the
calling thread and reports through `emit`. The window's engine runs it in a process of its own
(`engine.service.process`); tests and the benchmark's baseline may run it on a thread of the
window's process. Either way nothing else touches the runtime. Stop and pre-emption come
through a `Control`, which the engine checks between chunks, inside a chunk (llama.cpp's abort
callback) and between tokens.

Warm-ups (preparing the likely next prompt while the user reads) are pre-empted by any real
request: the front end bumps the control's epoch before sending one, and a warm-up whose epoch
is stale stops within a chunk, so the real request waits at most that.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from pathlib import Path

from engine.config.endpoints import parse_endpoint
from engine.config.params import CheckpointOptions
from engine.config.settings import Effect, Settings, effect_of
from engine.core.call_formats import ToolSupport
from engine.core.errors import ArborError, Cancelled, ContextOverflowError, UnsupportedRequest
from engine.core.results import (
    FailureKind,
    NodeView,
    Outcome,
    Rendered,
    ReplyFailure,
    ReplyReport,
    ReplyResult,
    Reuse,
    Source,
    Stopped,
)
from engine.core.tree import Node
from engine.files.paths import data_dirs
from engine.llm.generator import Generator
from engine.llm.reply import rendered, run_reply
from engine.llm.rpc import WorkersUnreachable
from engine.llm.runtime import Runtime
from engine.service.control import Control
from engine.service.protocol import (
    AdoptCheckpoints,
    CheckpointUsage,
    ConfigureRequest,
    Emit,
    EngineOptions,
    ExportDone,
    ExportRequest,
    Finished,
    ForgetRequest,
    GenerateRequest,
    LoadFailed,
    LoadProgress,
    LoadRequest,
    ModelLoaded,
    Piece,
    Progress,
    Request,
    Sync,
    Synced,
    TemplateChanged,
    Warmed,
    WarmRequest,
    node_key,
    node_of_key,
)
from engine.storage.checkpoints import CheckpointStore
from engine.storage.formats.arbor_file import SessionCheckpoint, write_session
from engine.storage.keyfile import installation_key

log = logging.getLogger(__name__)



class EngineService:
    """The engine's request handler: `handle` takes one protocol request and reports
    protocol events through `emit`. Any object with that method (and `close`) can stand in
    for it behind an `engine.service.client.EngineClient` (a scripted fake, in tests)."""

    def __init__(self, emit: Emit, control: Control, *,
                 generator: Generator | None = None) -> None:
        """`generator`: a model already loaded (a `Session` on its own runtime)."""
        self._emit = emit
        self.control = control
        self._generator: Generator | None = generator
        self._settings = Settings()
        self._path: str | None = None

    def handle(self, request: Request) -> None:
        """Run one request to the end; a bug in it is logged and reported, never raised."""
        match request:
            case LoadRequest():
                self.load(request)
            case ConfigureRequest():
                self.configure(request.settings)
            case WarmRequest():
                self.warm(request)
            case GenerateRequest():
                self.generate(request)
            case ExportRequest():
                self.export_session(request)
            case AdoptCheckpoints():
                self.adopt(request)
            case ForgetRequest():
                self.forget(request.conversation_id, request.node_ids)
            case Sync():
                self._emit(Synced(request.token))

    # --- the model ---------------------------------------------------------------------------

    def load(self, request: LoadRequest) -> None:
        settings = request.settings
        options = request.options or _options_of(settings, request.path)
        shown = [-1.0]

        def on_load_progress(fraction: float) -> None:
            # llama.cpp reports every tensor (hundreds of calls): pass on whole percents.
            if fraction >= 1.0 or fraction - shown[0] >= 0.01:
                shown[0] = fraction
                self._emit(LoadProgress(request.path, fraction))

        skipped: tuple[str, ...] = ()
        try:
            try:
                runtime = Runtime(
                    Path(request.path), options.runtime, on_load_progress=on_load_progress
                )
            except WorkersUnreachable as exc:
                if not request.without_unreachable_workers:
                    raise
                skipped = exc.endpoints  # the window: run without them, and say so
                runtime = Runtime(
                    Path(request.path),
                    replace(options.runtime, rpc_workers=tuple(
                        w for w in options.runtime.rpc_workers
                        if str(parse_endpoint(w)) not in skipped)),
                    on_load_progress=on_load_progress)
                runtime.notices.insert(0, f"{exc}; running without "
                                          f"{'them' if len(skipped) > 1 else 'it'}")
        except ArborError as exc:
            self._emit(LoadFailed(request.path, str(exc)))  # the previous model keeps working
            return
        except Exception as exc:  # a bug, not the file: still never leave the front end waiting
            log.exception("loading %s failed", request.path)
            self._emit(LoadFailed(
                request.path, f"an internal error stopped the load ({type(exc).__name__})"))
            return
        identity = runtime.identity()  # hashes the model file (cached, but once is enough)
        store_options = options.checkpoints
        try:
            generator = Generator(
                runtime, sampling=options.sampling, use_cache=options.use_cache,
                checkpoints=CheckpointStore(
                    identity, key=installation_key(), ram_budget=store_options.ram_budget,
                    disk_dir=store_options.disk_dir, disk_budget=store_options.disk_budget,
                ) if options.use_cache else None,
                checkpoint_interval=store_options.interval,
                template=options.template,
            )
        except ArborError as exc:  # a chat template Jinja or llama.cpp cannot use; a bad key
            runtime.close()
            self._emit(LoadFailed(request.path, str(exc)))
            return
        self.close()
        self._settings = settings
        self._path = request.path
        self._generator = generator
        self._emit(ModelLoaded(
            name=runtime.model.info.name,
            path=str(runtime.model.path),
            architecture=runtime.model.info.architecture,
            memory_kind=runtime.memory_kind.value,
            backend=runtime.backend,
            n_ctx=runtime.n_ctx,
            notices=tuple(runtime.notices),
            identity=identity,
            template=generator.template.describe(),
            template_name=generator.template.name,
            details=tuple(runtime.report().items()),
            gpu=runtime.gpu_memory(),  # measured with the previous model freed
            tool_format=_tool_format(generator),
        ))
        self._emit_usage()

    def configure(self, settings: Settings) -> None:
        effect = effect_of(self._settings, settings)
        generator = self._generator
        if effect in (Effect.RELOAD, Effect.INVALIDATE) and self._path is not None:
            self.load(LoadRequest(self._path, settings, without_unreachable_workers=True))
            return
        previous, self._settings = self._settings, settings
        if generator is None:
            return
        generator.configure(sampling=settings.sampling(),
                            checkpoint_interval=settings.checkpoint_interval)
        if self._path is not None:
            chosen = settings.template_for(self._path)
            if chosen != previous.template_for(self._path):
                generator.use_template(chosen)
                self._emit(TemplateChanged(generator.template.describe(),
                                           _tool_format(generator)))
        if generator.checkpoints is not None:
            generator.checkpoints.configure(ram_budget=settings.ram_budget(),
                                            disk_dir=self._disk_dir(settings))
        self._emit_usage()

    # --- replies -----------------------------------------------------------------------------

    def warm(self, request: WarmRequest) -> None:
        """Every warm request is answered with `Warmed`; `done` is False when it did not run
        to the end (stale, pre-empted, failed: a warm-up is only an optimisation)."""
        generator = self._generator
        skipped = Warmed(request.conversation_id, request.path[-1].id, 0, None, done=False)
        if generator is None or request.epoch != self.control.epoch():
            self._emit(skipped)
            return

        def stale() -> bool:
            return request.epoch != self.control.epoch()

        path = _keyed(request.conversation_id, request.path)
        untokenized = {node.id for node in path if node.tokens is None}
        try:
            prepared = generator.warm(path, resume=_resumed(request.conversation_id,
                                                            request.resume),
                                      cancel=stale, max_tokens=request.max_tokens,
                                      overflow=request.overflow, scope=request.scope)
        except Cancelled:
            log.debug("warm-up pre-empted")
            self._emit(skipped)
            return
        except ArborError as exc:
            log.info("warm-up skipped: %s", exc)
            self._emit(skipped)
            return
        except Exception:  # a warm-up is an optimisation: a bug in it must not cost a reply
            log.exception("warm-up failed")
            self._emit(skipped)
            return
        report = ReplyReport.of_prepare(prepared) if prepared is not None else None
        self._emit(Warmed(request.conversation_id, request.path[-1].id,
                          generator.runtime.canonical_tokens, report,
                          _local(rendered(path, untokenized))))
        if prepared is not None:
            self._spill(request.epoch)

    def generate(self, request: GenerateRequest) -> None:
        try:
            self._generate(request)
        finally:
            self.control.finished(request.request_id)

    def _generate(self, request: GenerateRequest) -> None:
        epoch = self.control.epoch()  # its own, sent with it: a later one is a newer request
        outcome = self._reply(request)
        self._emit(Finished(request.request_id, request.conversation_id, request.reply_id,
                            outcome))
        if isinstance(outcome, ReplyResult):
            self._spill(epoch)

    def _spill(self, epoch: int) -> None:
        """After a request's last event, so that its end never waits for the disk: spill the
        checkpoints over the RAM budget, giving way to a real request sent after the one
        that ran (the epoch is no longer `epoch`), then say what the store holds."""
        if self._generator is None:
            return
        self._generator.after_reply(yield_to=lambda: self.control.epoch() != epoch)
        self._emit_usage()

    def _reply(self, request: GenerateRequest) -> Outcome:
        generator = self._generator
        if generator is None:
            return ReplyFailure(FailureKind.ERROR, "no model is loaded")
        reuse: Reuse | None = None

        def on_plan(plan: Reuse) -> None:
            nonlocal reuse
            reuse = plan

        def on_progress(done: int, total: int) -> None:
            self._emit(Progress(request.request_id, reuse or Reuse(total, 0, Source.NONE, None),
                                done, total))

        opened = False

        def on_opened() -> None:
            nonlocal opened
            opened = True

        def on_piece(piece: str) -> None:
            self._emit(Piece(request.request_id, request.conversation_id, request.reply_id,
                             piece, opened))

        conversation = request.conversation_id
        path = _keyed(conversation, request.path)
        untokenized = {node.id for node in path if node.tokens is None}

        def kept() -> Rendered:  # tokens rendered before a stop or a failure stay theirs
            return _local(rendered(path, untokenized))

        try:
            result = run_reply(
                generator, path,
                resume=_resumed(conversation, request.resume),
                max_tokens=request.max_tokens, seed=request.seed, on_plan=on_plan,
                on_progress=on_progress, on_piece=on_piece, on_opened=on_opened,
                cancel=lambda: self.control.stop_requested(request.request_id),
                sampling=request.sampling, overflow=request.overflow, scope=request.scope,
            )
        except Cancelled:
            return Stopped(kept())
        except ContextOverflowError as exc:
            return ReplyFailure(FailureKind.OVERFLOW, str(exc), (exc.prompt_tokens, exc.n_ctx),
                                kept())
        except UnsupportedRequest as exc:
            return ReplyFailure(FailureKind.UNSUPPORTED, str(exc), rendered=kept())
        except ArborError as exc:
            return ReplyFailure(FailureKind.ERROR, str(exc), rendered=kept())
        except Exception as exc:  # a bug: report it, never leave the front end waiting
            log.exception("the reply failed")
            return ReplyFailure(FailureKind.INTERNAL,
                                f"an internal error stopped the reply ({type(exc).__name__}); "
                                f"what was written is saved", rendered=kept())
        return replace(result, rendered=_local(result.rendered))

    # --- checkpoints -------------------------------------------------------------------------

    def export_session(self, request: ExportRequest) -> None:
        """Write the session file here: the checkpoints live with the engine, and a file of a
        few hundred MiB should not hold the front end. Only this conversation's checkpoints go,
        read back from disk where spilled: whoever asked for them (the window, or its local
        API for a conversation the window lists), they are the conversation's."""
        generator = self._generator
        items: list[SessionCheckpoint] = []
        if generator is not None and generator.checkpoints is not None:
            store = generator.checkpoints
            for checkpoint in store.all():
                key = checkpoint.node_id
                if key is None or node_of_key(key)[0] != request.conversation_id:
                    continue
                if checkpoint.partial:  # nothing without this context's live cache
                    continue
                loaded = store.fetch(checkpoint)
                if loaded is not None and loaded.blob is not None:
                    items.append(SessionCheckpoint(0, loaded, store.identity))
        try:
            write_session(Path(request.path), list(request.records), items)
        except (ArborError, OSError) as exc:
            message = exc.strerror if isinstance(exc, OSError) else str(exc)
            self._emit(ExportDone(request.path, 0, f"it could not be written: {message}"))
            return
        self._emit(ExportDone(request.path, len(items), None))

    def adopt(self, request: AdoptCheckpoints) -> None:
        """Checkpoints from an imported session file: kept if they fit this context. Keyed
        by their tokens, they serve the imported conversation without any id mapping; they
        are the window's, whatever made them."""
        generator = self._generator
        store = generator.checkpoints if generator is not None else None
        if store is None or store.identity != request.identity:
            log.info("imported checkpoints do not fit the loaded model; not kept")
            return
        for checkpoint in request.checkpoints:
            store.add(replace(checkpoint, node_id=None, scope=""))
        store.enforce_budget()
        self._emit_usage()

    def forget(self, conversation_id: int, node_ids: tuple[int, ...]) -> None:
        if self._generator is not None:
            self._generator.forget(node_key(conversation_id, node) for node in node_ids)
            self._emit_usage()

    # --- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Free the model and its context (on the engine's own thread)."""
        if self._generator is not None:
            self._generator.runtime.close()
            self._generator = None

    @staticmethod
    def _disk_dir(settings: Settings) -> Path | None:
        return data_dirs().cache / "checkpoints" if settings.disk_tier else None

    def _emit_usage(self) -> None:
        store = self._generator.checkpoints if self._generator is not None else None
        if store is None:
            return
        stats = store.stats()
        self._emit(CheckpointUsage(
            count=stats.count, ram_bytes=stats.ram_bytes, disk_bytes=stats.disk_bytes,
            ram_budget=stats.ram_budget,
            nodes=tuple(sorted((*node_of_key(key), tier)
                               for key, tier in store.nodes_with_checkpoints().items())),
            stats=tuple(asdict(stats).items()),
        ))


def _tool_format(generator: Generator) -> str:
    """The name of how the generator's chat template writes tool calls ("" none known)."""
    try:
        return generator.prompts.tool_format().name
    except ToolSupport:
        return ""


def _options_of(settings: Settings, model: str) -> EngineOptions:
    """The app's settings as engine options."""
    return EngineOptions(
        runtime=settings.runtime(), sampling=settings.sampling(),
        checkpoints=CheckpointOptions(interval=settings.checkpoint_interval,
                                      ram_budget=settings.ram_budget(),
                                      disk_dir=EngineService._disk_dir(settings)),
        template=settings.template_for(model))


def _keyed(conversation_id: int, path: tuple[NodeView, ...]) -> list[Node]:
    """The engine's copies of a request's nodes, keyed by (conversation, node)."""
    return [view.to_node(node_key(conversation_id, view.id)) for view in path]


def _resumed(conversation_id: int, view: NodeView | None) -> Node | None:
    """The engine's copy of the reply a request continues, keyed as its path's nodes."""
    return view.to_node(node_key(conversation_id, view.id)) if view is not None else None


def _local(keyed: Rendered) -> Rendered:
    """Rendered tokens by the conversation's own node ids."""
    return tuple((node_of_key(key)[1], tokens) for key, tokens in keyed)
