"""The engine's side of the window, without widgets: the loaded model, the reply in progress,
warm-ups of the likely next prompt, and every event the engine sends back.

`Replies` runs a core `Change`'s reply job through its lifetime (`engine.service.lifetime`,
as the command line and the local API do): the reply node is created and saved first, then
the engine's pieces and outcome are applied to it on the GUI thread. It never decides tree
semantics, seeds or what a failure keeps. Events of a stopped or superseded request are
dropped by request id.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app.state.engine_client import QtEngine
from engine.config.overrides import Overrides
from engine.config.params import SamplingParams
from engine.config.settings import Settings
from engine.core.conversation import Change, ReplyJob
from engine.core.errors import ArborError
from engine.core.overflow import Overflow
from engine.core.reasoning import is_opened
from engine.core.results import NodeView, Outcome, ReplyReport, ReplyResult, Stopped
from engine.core.tools import tools_of
from engine.core.tree import Node, Role, Tree
from engine.models.fit import GpuMemory
from engine.service.lifetime import ReplyRun
from engine.service.protocol import (
    CheckpointUsage,
    EngineDied,
    EngineStarted,
    ExportDone,
    ExportRequest,
    Finished,
    LoadFailed,
    LoadProgress,
    LoadRequest,
    ModelLoaded,
    Piece,
    Progress,
    Request,
    TemplateChanged,
    Warmed,
    WarmRequest,
)
from engine.storage.store import StoreSink

if TYPE_CHECKING:
    from app.state.controller import ChatController

log = logging.getLogger(__name__)


class NotKept(Exception):
    """A save failed; the controller has told the user."""

# Quiet time after the user's last move before the engine warms the likely next prompt.
WARM_DELAY_MS = 250
# Why a session file the engine was writing when it died was not exported (the engine-death
# message already says so: no dialog of its own).
EXPORT_LOST = "the engine stopped while writing it"
_NO_ENGINE = "the engine is not running; open a model (Ctrl+M) and export it again"
# Engine deaths in a row (none of them followed by a model that loaded) before Arbor stops
# restarting it: a crash loop ends with a message, never a spinning window.
MAX_RESTARTS = 3


@dataclass
class Streaming:
    request_id: int
    run: ReplyRun  # the reply's lifetime: it applies every event to the conversation
    started: float
    answers_edit: bool = False  # the answer to an edit that waited for a reply to stop

    @property
    def conversation_id(self) -> int:
        return self.run.conversation_id

    @property
    def pieces(self) -> int:
        return self.run.pieces


@dataclass(frozen=True)
class PendingEdit:
    """An edit the user submitted while a reply streamed, to run once nothing streams. With
    `text` None the edit is already in the tree and only its answer is owed (the engine died
    before the answer said a word)."""

    conversation_id: int
    node_id: int
    text: str | None


class Replies(QObject):
    # The model.
    loading = Signal(str)  # a load started: what is loading, in words
    load_progress = Signal(float)
    model_ready = Signal()
    model_failed = Signal(str)  # why (the previous model, if any, keeps working)
    model_changed = Signal()  # `model` or `usage` changed: the status bar
    template_changed = Signal(str)
    # The reply in progress.
    claiming = Signal()  # a reply of the window's is about to be sent: the local API yields
    streaming_changed = Signal()
    preparing = Signal(int, int, str)  # tokens decoded, tokens to decode, what is reused
    answering_rate = Signal(float)  # tokens per second while the reply streams
    # reply node id, its text so far, its status, whether it began inside its reasoning
    piece_shown = Signal(int, str, str, bool)
    reply_finished = Signal()
    reply_kept = Signal(int, int)  # a reply finished and was kept: conversation, reply node
    reply_failed = Signal(str)  # why
    reply_stopped = Signal()  # the user stopped it before it said anything
    report = Signal(object)  # ReplyReport of the finished reply
    # Warm-ups.
    ready = Signal(int)  # a warm-up of the current conversation holds this many tokens
    warmed = Signal(object)  # Warmed, once applied
    # Session files written by the engine.
    exported = Signal(object)  # ExportDone
    # The engine process died: what happened and what Arbor does about it, in words.
    engine_lost = Signal(str)

    def __init__(self, controller: ChatController, engine: QtEngine) -> None:
        super().__init__(controller)
        self.controller = controller
        self.engine = engine
        self.model: ModelLoaded | None = None
        self.builtin_templates: tuple[str, ...] = ()  # chat templates llama.cpp knows by name
        self.engine_pid: int | None = None  # the engine process, when it runs in one
        self.gpu: GpuMemory | None = None  # the GPUs' memory as the engine last said; None: none
        self._model_path: str | None = None  # the model asked for last (reloaded after a crash)
        self._deaths = 0  # engine deaths since a model last loaded
        self.usage: CheckpointUsage | None = None
        self.marks: dict[int, dict[int, str]] = {}  # conversation -> node -> "ram" | "disk"
        self.streaming: Streaming | None = None
        self.last_result: ReplyResult | None = None  # as the engine sent it
        self.editing: int | None = None  # the message being edited in place, if any
        self._pending_edit: PendingEdit | None = None  # submitted during a reply
        self._exports: list[str] = []  # session files the engine is writing (their paths)
        self._request_ids = itertools.count(1)
        self.prepare_started = 0.0  # when the reply in progress was sent (monotonic)
        # What the last warm-up prepared: (conversation, path's ids, the reply it continues).
        self._warmed: tuple[int, tuple[int, ...], int | None] | None = None
        self._warm_timer = QTimer(self, singleShot=True, interval=WARM_DELAY_MS)
        self._warm_timer.timeout.connect(self._warm_now)
        engine.received.connect(self.on_event)

    # --- requests ----------------------------------------------------------------------------

    def send(self, request: Request) -> None:
        if isinstance(request, ExportRequest):
            if not self.engine.running:  # given up after a crash loop: nothing would answer
                self.exported.emit(ExportDone(request.path, 0, _NO_ENGINE))
                return
            self._exports.append(request.path)
        self.engine.send(request)

    def load(self, path: str) -> None:
        """Load a model; until it is ready the previous one (if any) keeps answering."""
        if not self.engine.running:  # given up after a crash loop: the user tries again
            self._deaths = 0
            self.engine.restart()
        self._model_path = path
        self.loading.emit(path)
        self.engine.send(LoadRequest(path=path, settings=self.controller.settings,
                                      without_unreachable_workers=True))

    @property
    def model_path(self) -> str | None:
        """The model loaded (or being loaded) last."""
        return self._model_path

    def free_vram(self) -> int | None:
        """What a model loaded in place of the current one may take on the GPUs, as the engine
        last measured (Discover's fit); None without a GPU, or before the engine said."""
        return self.gpu.for_a_model if self.gpu is not None else None

    def refuse(self) -> bool:
        """True (and the user is told why) when a reply cannot start now."""
        if self.streaming is not None:
            self.controller.notice.emit("Arbor is still answering; press Esc to stop it.", 4000)
            return True
        if self.model is None:
            self.controller.notice.emit("The model is still loading.", 4000)
            return True
        return False

    def answering(self, conversation_id: int) -> bool:
        return self.streaming is not None and self.streaming.conversation_id == conversation_id

    def start(self, conversation_id: int, change: Change) -> None:
        """Run the change's reply job: the reply node is created (streaming) and saved, then
        the engine prepares and answers on a copy of the path."""
        job = change.reply
        if job is None:
            return
        controller = self.controller
        conversation = controller.conversations[conversation_id]
        tree = conversation.tree
        leaf = tree.active_leaf
        sink = StoreSink(controller.store, conversation_id)

        def keep(nodes: Sequence[Node], deleted: Sequence[int]) -> None:
            if not controller.save(conversation_id, nodes, deleted):
                raise NotKept  # the controller has told the user

        def streaming(node: Node) -> None:
            try:
                sink.streaming(node)  # saved at most a second behind
            except ArborError as exc:  # a full disk, say: the final save will say so too
                log.warning("the growing reply could not be saved: %s", exc)
                controller.notice.emit(f"The reply could not be saved yet: {exc}", 4000)

        try:
            run = ReplyRun.begin(conversation, job, keep, conversation_id=conversation_id,
                                 streaming=streaming)
        except NotKept:  # not saved: not shown either
            if leaf in tree:
                tree.set_active(leaf)
            controller.changed.emit()
            return
        overrides = controller.overrides(conversation_id)
        settings = overrides.apply(controller.settings)  # the conversation's own, over defaults
        request_id = next(self._request_ids)
        self.streaming = Streaming(request_id, run, time.monotonic())
        self._warm_timer.stop()
        self._warmed = None
        self.claiming.emit()  # at once: an API reply's stop goes out before this request
        self.engine.send(run.request(
            request_id, max_tokens=settings.max_tokens,
            seed=conversation.reply_seed(settings.seed),
            sampling=_sampling(overrides, settings, tree, job),
            overflow=settings.overflow))
        self.prepare_started = time.monotonic()
        self.streaming_changed.emit()
        controller.changed.emit()

    def stop(self) -> None:
        """Stop the window's reply, and only it (never a reply of the local API's)."""
        if self.streaming is not None:
            self.engine.stop(self.streaming.request_id)

    def defer_edit(self, conversation_id: int, node_id: int, text: str) -> None:
        """An edit submitted while a reply streams: the reply stops, then the edit runs."""
        self._pending_edit = PendingEdit(conversation_id, node_id, text)
        self.stop()
        self.controller.notice.emit("Stopping the reply to answer your edit…", 4000)

    # --- events ------------------------------------------------------------------------------

    @Slot(object)
    def on_event(self, event: object) -> None:
        match event:
            case Piece():
                self._on_piece(event)
            case Progress():
                self._on_progress(event)
            case Finished():
                self._on_finished(event)
            case Warmed():
                self._on_warmed(event)
            case CheckpointUsage():
                self._on_usage(event)
            case LoadProgress():
                self.load_progress.emit(event.fraction)
            case EngineStarted():
                self.engine_pid = event.pid
                self.builtin_templates = event.builtin_templates
                self.gpu = event.gpu
            case EngineDied():
                self._on_engine_died(event)
            case ModelLoaded():
                self.model = event
                self.gpu = event.gpu
                self._deaths = 0
                self._warmed = None  # a new context holds nothing
                self.model_changed.emit()
                self.model_ready.emit()
                if self.streaming is None and not self._run_pending_edit():
                    self.schedule_warm()
            case LoadFailed():
                self.model_failed.emit(event.message)
            case TemplateChanged():
                self._on_template_changed(event)
            case ExportDone():
                if event.path in self._exports:
                    self._exports.remove(event.path)
                self.exported.emit(event)

    def _on_engine_died(self, died: EngineDied) -> None:
        """Whatever the engine was doing is lost, nothing saved is: a reply in progress is
        kept as interrupted (Continue picks it up), and the engine starts again with the
        model it had, unless it keeps dying. An edit that waited for the reply to stop is
        answered once the model is back; if it is not coming back, the edit is saved
        unanswered. A question whose prompt crashed llama.cpp's fast kernels is answered
        again once the model is back without them."""
        lost = self._exports_lost()
        streaming = self.streaming
        pending, self._pending_edit = self._pending_edit, None
        if pending is None and streaming is not None and streaming.pieces == 0 and (
                streaming.answers_edit  # the edit ran, its answer had not begun
                or died.kernels_fallback is not None):  # the question is asked again

            asked = streaming.run.start.path[-1]
            pending = PendingEdit(streaming.conversation_id, asked.id, None)
        if streaming is not None:
            self.interrupt(streaming)
            self._end_reply(warm=False)
        self.model = None
        self.model_changed.emit()
        self._deaths += 1
        what = f"The engine stopped: {died.describe()}."
        if self.controller.settings.rpc_workers:
            what += (" With RPC workers this is most often a worker that stopped answering; "
                     "the reload leaves out any that does not answer and names it.")
        saved = " The reply so far is saved; Continue (Ctrl+Shift+Return) goes on with it." \
            if streaming is not None and streaming.pieces else ""
        if lost:
            saved += f" {', '.join(lost)} {'was' if len(lost) == 1 else 'were'} not exported; " \
                     "export again once the model is loaded."
        if self._deaths >= MAX_RESTARTS or self._model_path is None:
            self.engine.shutdown()
            if pending is not None:
                if pending.text is not None:
                    self._run_edit(pending, answer=False)
                saved += " Your edit is saved; Regenerate answers it once a model is loaded."
            again = (f" It stopped {self._deaths} times in a row, so Arbor leaves it off: "
                     "open a model (Ctrl+M) to try again." if self._model_path else
                     " Open a model (Ctrl+M) to start it again.")
            self.engine_lost.emit(what + saved + again)
            return
        self._pending_edit = pending  # answered when the model is loaded again
        self.engine.restart()
        self.load(self._model_path)
        self.engine_lost.emit(what + saved + " Loading the model again…")

    def _exports_lost(self) -> list[str]:
        """Session files the dead engine was writing, by name (the engine-death message
        names them): each ends as not exported (`exported`, with EXPORT_LOST), and what it
        had written is removed (an atomic write leaves its temporary file behind when its
        process is killed; the file itself is the old one or none)."""
        lost, self._exports = self._exports, []
        for path in lost:
            target = Path(path)
            for partial in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
                partial.unlink(missing_ok=True)
            self.exported.emit(ExportDone(path, 0, EXPORT_LOST))
        return [Path(path).name for path in lost]

    def _mine(self, request_id: int) -> Streaming | None:
        """The reply in progress if an event belongs to it; a late event of a stopped or
        superseded request finds None and is dropped."""
        streaming = self.streaming
        return streaming if streaming is not None and streaming.request_id == request_id else None

    def _on_progress(self, progress: Progress) -> None:
        if self._mine(progress.request_id) is None:
            return
        self.preparing.emit(progress.done, progress.total, progress.reuse.describe())

    @property
    def last_reply(self) -> ReplyReport | None:
        """The figures of the last finished reply."""
        return self.last_result.report if self.last_result is not None else None

    def _on_piece(self, piece: Piece) -> None:
        streaming = self._mine(piece.request_id)
        if streaming is None or streaming.run.taken_back:
            return
        node = streaming.run.piece(piece.text, opened=piece.reasoning_opened)
        self.answering_rate.emit(
            streaming.pieces / max(1e-3, time.monotonic() - streaming.started))
        if streaming.conversation_id == self.controller.current:
            self.piece_shown.emit(node.id, node.text, node.status.value, is_opened(node.meta))

    def _on_finished(self, finished: Finished) -> None:
        streaming = self._mine(finished.request_id)
        if streaming is None:
            return
        outcome = finished.outcome
        self._apply(streaming, outcome)
        if isinstance(outcome, ReplyResult):
            self.last_result = outcome
            self.report.emit(outcome.report)
            self._end_reply()
            if self.streaming is None:  # not superseded by an edit submitted meanwhile
                self.reply_kept.emit(streaming.conversation_id, streaming.run.reply.id)
            return
        self._end_reply()
        if isinstance(outcome, Stopped):
            self.reply_stopped.emit()
            return
        message = outcome.message
        settings = self.controller.overrides(streaming.conversation_id).apply(
            self.controller.settings)
        if outcome.overflow is not None and settings.overflow is Overflow.STOP:
            message += (". Or let Arbor leave the oldest messages out when the context is "
                        "full: Edit > Conversation settings, or Settings for every "
                        "conversation.")
        self.reply_failed.emit(message)

    def _apply(self, streaming: Streaming, outcome: Outcome) -> None:
        """The reply's lifetime applies the outcome (its failure policy), unless its
        conversation has been closed since."""
        if streaming.conversation_id in self.controller.conversations:
            with contextlib.suppress(NotKept):  # the controller has told the user
                streaming.run.finish(outcome)

    def interrupt(self, streaming: Streaming) -> None:
        """The reply ends without the engine's word (the engine died, the window closes):
        what it said is kept as interrupted (it can be continued), or it is taken back."""
        self._apply(streaming, Stopped())

    def _end_reply(self, *, warm: bool = True) -> None:
        self.streaming = None
        self.streaming_changed.emit()
        self.controller.changed.emit()
        self.reply_finished.emit()
        if warm and not self._run_pending_edit():
            self.schedule_warm()

    def _run_pending_edit(self) -> bool:
        """The edit submitted during a reply, now that nothing streams. True if it ran."""
        pending, self._pending_edit = self._pending_edit, None
        return pending is not None and self._run_edit(pending)

    def _run_edit(self, edit: PendingEdit, *, answer: bool = True) -> bool:
        tree = self.controller.tree_of(edit.conversation_id)
        if tree is None or edit.node_id not in tree:
            return False
        self.controller.open_conversation(edit.conversation_id)
        if edit.text is None:  # already edited: a reply to it
            self.controller.regenerate(edit.node_id)
        else:
            self.controller.edit(edit.node_id, edit.text, answer=answer)
        if self.streaming is not None:  # an answer owed after a death is owed only once
            self.streaming.answers_edit = edit.text is not None
        return True

    def _on_usage(self, usage: CheckpointUsage) -> None:
        self.usage = usage
        current = self.controller.current
        shown = self.marks.get(current) if current is not None else None
        self.marks = {}
        for cid, nid, tier in usage.nodes:
            self.marks.setdefault(cid, {})[nid] = tier
        self.model_changed.emit()
        if current is not None and self.marks.get(current) != shown:
            self.controller.changed.emit()  # only the marks changed; nothing to redraw otherwise

    def _on_template_changed(self, changed: TemplateChanged) -> None:
        if self.model is not None:
            self.model = replace(self.model, template=changed.description,
                                 tool_format=changed.tool_format)
            self.model_changed.emit()
        self.template_changed.emit(changed.description)
        self._warmed = None  # the next prompt's opening may render differently now
        self.schedule_warm()

    # --- warm-ups: the likely next prompt, prepared while the user reads ----------------------

    def schedule_warm(self) -> None:
        if self.model is not None and self.streaming is None:
            self._warm_timer.start()

    def start_editing(self, node_id: int) -> None:
        self.editing = node_id
        self.schedule_warm()

    @Slot()
    def _warm_now(self) -> None:
        cid = self.controller.current
        if (self.model is None or self.streaming is not None or cid is None
                or not self.engine.running):  # closed: the store may be closed too
            return
        path, resume = self.controller.conversations[cid].warm_target(self.editing)
        key = (cid, tuple(node.id for node in path), resume.id if resume is not None else None)
        if not path or key == self._warmed:
            return
        self._warmed = key
        self.ready.emit(0)  # a "ready" shown was about another branch
        settings = self.controller.overrides(cid).apply(self.controller.settings)
        self.engine.send(WarmRequest(self.engine.epoch(), cid,
                                     tuple(NodeView.of(node) for node in path),
                                     settings.max_tokens, settings.overflow,
                                     resume=NodeView.of(resume) if resume is not None else None))

    def _on_warmed(self, warmed: Warmed) -> None:
        if not warmed.done:
            return  # pre-empted: the request that did it is on its way
        conversation = self.controller.conversations.get(warmed.conversation_id)
        if conversation is not None:
            # What the warm-up rendered is what those nodes keep: the request that follows
            # finds them rendered (a template with the date in it cannot move them).
            adopted = conversation.adopt_tokens(warmed.rendered)
            if adopted and not self.controller.save(warmed.conversation_id, adopted):
                for node in adopted:
                    node.tokens = None
        if (self.streaming is None and warmed.conversation_id == self.controller.current
                and warmed.prompt_tokens):
            self.ready.emit(warmed.prompt_tokens)
        self.warmed.emit(warmed)


def _sampling(overrides: Overrides, settings: Settings, tree: Tree, job: ReplyJob
              ) -> SamplingParams | None:
    """The reply's sampling (None: the engine's defaults). A conversation that asks for a
    tool call first gets a forced call (`tool_choice` "required") in its replies to user
    messages; replies to tools' results are free to answer."""
    forced = (overrides.tool_first and job.resume is None and tools_of(tree.root.meta)
              and tree.node(job.parent).role is Role.USER)
    if forced:
        return replace(settings.sampling(), tool_choice="required")
    return None if overrides.is_default else settings.sampling()
