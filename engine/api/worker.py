"""The API's one engine: replies run one at a time, in arrival order, on one thread.

The HTTP side hands a `Job` to `ApiWorker.submit` (a bounded queue: a full one is a 429) and
reads what the job delivers: pieces of text, then the outcome or an error. The worker thread
owns the store connection and the trees, places the request (`engine.api.trees`), runs the
reply on the engine through a `Replier` (`engine.remote.RemoteReplier`: llama.cpp in a process
of its own, restarted if it dies) and saves the result, as the window does. A job whose client
went away is cancelled: its reply stops within one token, or it never starts.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine.api.schema import ApiError, ChatRequest, Usage
from engine.api.stops import StopScanner
from engine.api.trees import ApiTrees, Placed
from engine.errors import ArborError, Cancelled, ContextOverflowError
from engine.params import FinishReason
from engine.protocol import ModelLoaded
from engine.remote import EngineCrashed, RemoteReplier
from engine.settings import Settings
from engine.store import Store
from engine.tree import NodeStatus

log = logging.getLogger(__name__)

MAX_QUEUE = 16


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Outcome:
    text: str
    finish: str  # OpenAI's finish_reason: "stop" or "length"
    usage: Usage
    conversation_id: int


Delivery = Text | Outcome | ApiError


@dataclass
class Job:
    request: ChatRequest
    deliver: Callable[[Delivery], None]  # called on the worker thread
    cancelled: threading.Event = field(default_factory=threading.Event)


class ApiWorker:
    """Start with `start()` (loads the model, raises ArborError if it cannot), then `submit`."""

    def __init__(self, model: Path, settings: Settings, db: Path | None, *,
                 max_queue: int = MAX_QUEUE,
                 replier: Callable[[], RemoteReplier] = RemoteReplier) -> None:
        self.model = model
        self.settings = settings
        self.db = db
        self.loaded: ModelLoaded | None = None
        self._new_replier = replier
        self._replier: RemoteReplier | None = None
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    # --- the HTTP side ---------------------------------------------------------------------

    def start(self) -> ModelLoaded:
        self._thread = threading.Thread(target=self._run, name="arbor-api-worker", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure
        assert self.loaded is not None
        return self.loaded

    def submit(self, job: Job) -> None:
        if self._replier is None and self.loaded is None:
            raise ApiError(503, "no model is loaded", type="server_error")
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise ApiError(429, f"the server is busy: {self._queue.maxsize} requests are "
                                "waiting for the model; try again shortly",
                           type="rate_limit_error", code="queue_full") from None

    def close(self) -> None:
        if self._thread is None:
            return
        while True:  # make room for the end marker: queued jobs are answered 503
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.deliver(ApiError(503, "the server is shutting down", type="server_error"))
        self._queue.put(None)
        self._thread.join()
        self._thread = None

    # --- the worker thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            # The app may have the database open and be streaming: no recovery from here.
            store = Store(self.db, recover=False)
            self._load()
        except BaseException as exc:  # reported to start()
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        assert self.loaded is not None
        identity = self.loaded.identity
        trees = ApiTrees(store, identity.model_sha256 if identity else self.loaded.path)
        try:
            while (job := self._queue.get()) is not None:
                if job.cancelled.is_set():
                    continue
                try:
                    job.deliver(self._answer(job, trees))
                except ApiError as error:
                    job.deliver(error)
                except Exception:  # a bug: the client gets a 500, the server goes on
                    log.exception("an API request failed")
                    job.deliver(ApiError(500, "an internal error stopped the reply",
                                         type="server_error"))
        finally:
            if self._replier is not None:
                self._replier.close()
            store.close()

    def _load(self) -> None:
        self._replier = self._new_replier()
        self.loaded = self._replier.load(str(self.model), settings=self.settings)

    def _restart(self) -> None:
        """After the engine died: a new one with the same model (if it loads)."""
        old, self._replier, self.loaded = self._replier, None, None
        if old is not None:
            old.close()
        try:
            self._load()
        except ArborError as exc:
            log.error("the engine could not be started again: %s", exc)

    def _answer(self, job: Job, trees: ApiTrees) -> Outcome:
        request = job.request
        replier, loaded = self._replier, self.loaded
        if replier is None or loaded is None:
            raise ApiError(503, "the model is not loaded (the engine stopped)",
                           type="server_error")
        placed = trees.place(request.system, request.messages)
        conversation, change = placed.tree.conversation, placed.change
        tree = conversation.tree
        assert change.reply is not None
        start = conversation.start_reply(change.reply)
        if placed.tree.id is not None:  # a new tree is written with its first reply
            trees.save(placed.tree, [*change.nodes, start.reply])
        stops = StopScanner(request.stop)

        def on_piece(piece: str) -> None:
            shown = stops.feed(piece)
            if shown:
                job.deliver(Text(shown))

        settings = self.settings
        sampling = settings.sampling()
        if request.temperature is not None:
            sampling = replace(sampling, temperature=request.temperature)
        if request.top_p is not None:
            sampling = replace(sampling, top_p=request.top_p)
        seed = request.seed if request.seed is not None else conversation.reply_seed(
            settings.seed)
        try:
            result = replier.reply(
                start.path, resume=None, max_tokens=request.max_tokens or loaded.n_ctx,
                seed=seed, on_piece=on_piece, sampling=sampling,
                cancel=lambda: job.cancelled.is_set() or stops.hit)
        except ArborError as exc:
            _take_back(trees, placed, start.reply.id)
            if isinstance(exc, EngineCrashed):
                self._restart()
            raise _api_error(exc) from None
        if not stops.hit:
            rest = stops.flush()
            if rest:
                job.deliver(Text(rest))
        else:  # cut at a stop sequence: the node keeps the text the client got
            result = replace(result, text=stops.text,
                             report=replace(result.report, finish=FinishReason.STOP))
        finished = conversation.finish_reply(start.reply.id, result)
        if stops.hit:  # its tokens went past the cut: they are rendered again from the text
            reply = tree.node(start.reply.id)
            reply.tokens, reply.meta = None, {"finish": FinishReason.STOP.value}
            reply.status = NodeStatus.COMPLETE
        trees.save(placed.tree, [*change.nodes, *finished.nodes], finished.deleted)
        report = result.report
        return Outcome(
            text=result.text,
            finish="length" if report.finish in (FinishReason.LENGTH, FinishReason.CONTEXT_FULL)
            else "stop",
            usage=Usage(report.prompt_tokens, report.generated_tokens, report.reused_tokens),
            conversation_id=placed.tree.id or 0)


def _take_back(trees: ApiTrees, placed: Placed, reply_id: int) -> None:
    """A request that got no reply leaves its tree as it was (a new tree: not written)."""
    tree = placed.tree.conversation.tree
    gone: list[int] = []
    for node_id in (reply_id, *(n.id for n in placed.change.nodes)):
        if node_id in tree:
            gone += tree.delete_branch(node_id)
    if placed.tree.id is None:
        trees.forget(placed.tree)
        return
    try:
        trees.save(placed.tree, (), gone)
    except ArborError:
        log.exception("could not take back a failed request")
        trees.forget(placed.tree)  # read again from the store next time


def _api_error(exc: ArborError) -> ApiError:
    if isinstance(exc, Cancelled):
        return ApiError(499, "the client went away", type="cancelled")
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, EngineCrashed):
        return ApiError(503, f"{exc}; the model is being loaded again", type="server_error")
    return ApiError(500, str(exc), type="server_error")
