"""A scripted engine that speaks the real protocol: for window and controller tests.

`FakeEngineService` has the shape of the real `EngineService` (engine.service.handler): built
with an `emit` for its events and the `Control` the front end stops and pre-empts through, it
takes one protocol request at a time in `handle` and answers with protocol events, in the real
engine's order. No model is loaded: a reply is text derived from the prompt (`Script.reply`),
one piece per word, with a fake tokenizer (one token per word) behind every count, so what the
window shows (streaming, a stop, a failure, what a prepare reused, the checkpoint marks) comes
from the same events the real engine sends. Tests that prove the engine's own behaviour (real
replies, the invariant, a crash and a restart) stay on the real engine.

`in_process_client` plugs it into the in-process client kind: the one place that knows how that
client builds its handler.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config.settings import Settings
from engine.core.errors import ContextOverflowError
from engine.core.overflow import Overflow
from engine.core.results import (
    FailureKind,
    FinishReason,
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
from engine.core.tools import TOOL_CALLS, ToolCall
from engine.models.fit import GpuMemory
from engine.service.protocol import (
    AdoptCheckpoints,
    CheckpointUsage,
    ConfigureRequest,
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
)

if TYPE_CHECKING:

    from app.state.engine_client import QtEngine
    from engine.service.control import Control
    from engine.service.protocol import Emit

CHUNK = 8  # prompt tokens per Progress event, as the real engine reports per chunk
CHECKPOINT_BYTES = 1 << 20  # what each fake checkpoint says it holds
# Per message, the template's opening and closing tokens (a real template adds a few).
OPENING, CLOSING = 1, 2


def tokenize(text: str) -> tuple[int, ...]:
    """One token per word, the same word the same token (stable across runs)."""
    return tuple(100 + zlib.crc32(word.encode()) % 30_000 for word in text.split())


def echo(prompt: str, seed: int) -> str:
    """The default reply: derived from the message it answers (and nothing random)."""
    return f"You said: {prompt}" if prompt else "You said nothing."


@dataclass
class Script:
    """What the fake engine does. A test may change it between requests: the engine reads it
    as a request runs (`hold` and `reply_failure` at a reply's first piece)."""

    # The reply to the last message of a path, given the reply's seed.
    reply: Callable[[str, int], str] = echo
    # A load of one of these paths fails with the message (the previous model keeps working).
    failing_models: dict[str, str] = field(default_factory=dict)
    # Every reply fails with this message after its first piece.
    reply_failure: str | None = None
    # The next reply waits for a stop after its first piece (a test acts while it streams);
    # it clears this, so the reply after it runs through.
    hold: bool = False
    # The GPUs' memory a load reports (`ModelLoaded.gpu`); None: a machine without a GPU.
    gpu: GpuMemory | None = None
    # The next reply makes these tool calls (its meta, as the real engine writes it); they
    # are cleared once made.
    calls: list[ToolCall] = field(default_factory=list)
    # Every request, in the order handled (read on the GUI thread once answered).
    requests: list[Request] = field(default_factory=list)


class FakeEngineService:
    """The engine-side handler: `handle(request)` runs one request to the end on the calling
    thread and reports through `emit`, honouring stops and pre-emption through `control`."""

    def __init__(self, emit: Emit, control: Control, script: Script | None = None) -> None:
        self._emit = emit
        self.control = control
        self.script = script if script is not None else Script()
        self._model: str | None = None
        self._settings = Settings()
        self._live: tuple[int, ...] = ()  # the tokens the "context" holds
        self._checkpoints: set[tuple[int, int]] = set()  # (conversation, node) with one

    def handle(self, request: Request) -> None:
        self.script.requests.append(request)
        match request:
            case LoadRequest():
                self._load(request)
            case ConfigureRequest():
                self._configure(request.settings)
            case WarmRequest():
                self._warm(request)
            case GenerateRequest():
                try:
                    self._generate(request)
                finally:
                    self.control.finished(request.request_id)
            case ExportRequest():
                self._export(request)
            case AdoptCheckpoints():
                self._emit_usage()
            case ForgetRequest():
                self._checkpoints -= {(request.conversation_id, node) for node in request.node_ids}
                self._emit_usage()
            case Sync():
                self._emit(Synced(request.token))

    def close(self) -> None:
        self._model = None

    # --- the model ---------------------------------------------------------------------------

    def _load(self, request: LoadRequest) -> None:
        for fraction in (0.0, 0.5, 1.0):
            self._emit(LoadProgress(request.path, fraction))
        failure = self.script.failing_models.get(request.path)
        if failure is not None:
            self._emit(LoadFailed(request.path, failure))
            return
        self._model, self._settings, self._live = request.path, request.settings, ()
        self._checkpoints.clear()
        self._emit(ModelLoaded(
            name=Path(request.path).stem, path=request.path, architecture="fake",
            memory_kind="dense", backend="CPU", n_ctx=request.settings.n_ctx, notices=(),
            template="the fake engine's template", template_name="fake", gpu=self.script.gpu))
        self._emit_usage()

    def _configure(self, settings: Settings) -> None:
        previous, self._settings = self._settings, settings
        if self._model is None:
            return
        if settings.n_ctx != previous.n_ctx:  # a new context: loaded again, empty
            self._load(LoadRequest(self._model, settings))
            return
        if settings.template_for(self._model) != previous.template_for(self._model):
            self._emit(TemplateChanged(f"{settings.template_for(self._model)} (fake)"))
        self._emit_usage()

    # --- replies -----------------------------------------------------------------------------

    def _warm(self, request: WarmRequest) -> None:
        last = request.path[-1].id
        if self._model is None or request.epoch != self.control.epoch():
            self._emit(Warmed(request.conversation_id, last, 0, None, done=False))
            return
        prompt, rendered = _prompt(request.path, request.resume)
        report = self._prepare(prompt)
        self._emit(Warmed(request.conversation_id, last, len(prompt), report, rendered))
        self._emit_usage()  # after `Warmed`, as the engine's spills follow a request's end

    def _generate(self, request: GenerateRequest) -> None:
        if self._model is None:
            self._finish(request, ReplyFailure(FailureKind.ERROR, "no model is loaded"))
            return
        script = self.script
        prompt, rendered = _prompt(request.path, request.resume)
        n_ctx = self._settings.n_ctx
        if len(prompt) >= n_ctx and request.overflow is Overflow.STOP:
            error = ContextOverflowError(len(prompt), n_ctx)
            self._finish(request, ReplyFailure(FailureKind.OVERFLOW, str(error),
                                               (len(prompt), n_ctx)))
            return
        if self.control.stop_requested(request.request_id):
            self._finish(request, Stopped())  # stopped before it began: nothing said
            return
        reused = _common_prefix(self._live, prompt)
        reuse = Reuse(len(prompt), reused, Source.LIVE if reused else Source.NONE, None)
        # Chunk by chunk, and at least once (the real engine reports a prompt held whole too).
        for done in range(min(reused + CHUNK, len(prompt)), len(prompt) + CHUNK, CHUNK):
            if self.control.stop_requested(request.request_id):
                self._finish(request, Stopped())  # stopped in the prepare: nothing said
                return
            self._emit(Progress(request.request_id, reuse, min(done, len(prompt)),
                                len(prompt)))
        self._live = prompt
        words = script.reply(request.path[-1].text, request.seed).split()
        finish = FinishReason.STOP
        if len(words) > request.max_tokens:
            words, finish = words[:request.max_tokens], FinishReason.LENGTH
        said: list[str] = []
        for word in words:
            if self.control.stop_requested(request.request_id):
                finish = FinishReason.CANCELLED
                break
            piece = word if not said and request.resume is None else f" {word}"
            said.append(piece)
            self._emit(Piece(request.request_id, request.conversation_id, request.reply_id,
                             piece))
            if len(said) == 1:
                if script.reply_failure is not None:
                    self._finish(request, ReplyFailure(FailureKind.ERROR,
                                                       script.reply_failure))
                    return
                if script.hold:
                    script.hold = False
                    # The control has nothing to wait on: poll it, as the real engine does
                    # between tokens. A shutdown stops whatever runs, so this always ends.
                    while not self.control.stop_requested(request.request_id):
                        time.sleep(0.002)
        base = request.resume.text if request.resume is not None else ""
        text = base + "".join(said)
        generated = tokenize("".join(said))
        self._live = prompt + generated
        tokens = (*tokenize(text), *(0,) * CLOSING)
        report = ReplyReport(
            prompt_tokens=len(prompt), reused_tokens=reused, decoded_tokens=len(prompt) - reused,
            source=Source.LIVE if reused else Source.NONE, checkpoint_pos=None,
            prefill_ms=1.0, ttft_ms=2.0, generated_tokens=len(generated), decode_ms=1.0,
            finish=finish)
        meta: tuple[tuple[str, object], ...] = (("open_len", None), ("prompt_len", OPENING))
        if script.calls:
            meta += ((TOOL_CALLS, [call.to_meta() for call in script.calls]),)
            script.calls = []
        self._checkpoints.add((request.conversation_id, request.reply_id))
        self._finish(request, ReplyResult(text, tokens, meta, rendered, report))
        self._emit_usage()  # after `Finished`, as the engine's spills follow a request's end

    def _finish(self, request: GenerateRequest, outcome: Outcome) -> None:
        self._emit(Finished(request.request_id, request.conversation_id, request.reply_id,
                            outcome))

    def _prepare(self, prompt: tuple[int, ...]) -> ReplyReport:
        reused = _common_prefix(self._live, prompt)
        self._live = prompt
        return ReplyReport(prompt_tokens=len(prompt), reused_tokens=reused,
                           decoded_tokens=len(prompt) - reused,
                           source=Source.LIVE if reused else Source.NONE, checkpoint_pos=None,
                           prefill_ms=1.0)

    # --- checkpoints -------------------------------------------------------------------------

    def _export(self, request: ExportRequest) -> None:
        """A session file with the conversation and no checkpoints (the fake has none)."""
        from engine.storage.formats.arbor_file import write_session

        try:
            write_session(Path(request.path), list(request.records))
        except OSError as exc:
            self._emit(ExportDone(request.path, 0, f"it could not be written: {exc.strerror}"))
            return
        self._emit(ExportDone(request.path, 0, None))

    def _emit_usage(self) -> None:
        count = len(self._checkpoints)
        self._emit(CheckpointUsage(
            count=count, ram_bytes=count * CHECKPOINT_BYTES, disk_bytes=0,
            ram_budget=self._settings.ram_budget() or 0,
            nodes=tuple((conversation, node, "ram")
                        for conversation, node in sorted(self._checkpoints))))


def in_process_client(script: Script) -> QtEngine:
    """The in-process client kind (the engine on a thread of this process) with the fake
    engine as its handler instead of the real service."""
    from app.state.engine_client import ThreadEngine

    def build(emit: Emit, control: Control) -> FakeEngineService:
        return FakeEngineService(emit, control, script)

    return ThreadEngine(handler=build)


def _message_tokens(view: NodeView) -> tuple[int, ...]:
    if view.tokens is not None:
        return view.tokens
    return (*(0,) * OPENING, *tokenize(view.text), *(0,) * CLOSING)


def _prompt(path: tuple[NodeView, ...], resume: NodeView | None = None
            ) -> tuple[tuple[int, ...], Rendered]:
    """The path's prompt tokens (with `resume`, the reply so far is part of what is read),
    and the tokens rendered now for nodes that had none (they keep them, as with the real
    engine)."""
    prompt: list[int] = []
    rendered: list[tuple[int, tuple[int, ...]]] = []
    for view in path:
        tokens = _message_tokens(view)
        if view.tokens is None:
            rendered.append((view.id, tokens))
        prompt.extend(tokens)
    prompt.extend((0,) * OPENING)
    if resume is not None:
        prompt.extend(_message_tokens(resume)[:-CLOSING])
    return tuple(prompt), tuple(rendered)


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


