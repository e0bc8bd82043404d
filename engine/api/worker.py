"""The API's one engine: replies run one at a time, in arrival order, on one thread.

The HTTP side hands a `Job` to `ApiWorker.submit` (a bounded queue: a full one is a 429) and
reads what the job delivers: pieces of text, then the outcome or an error. The worker thread
takes the jobs in order. For each it asks its `TreeSide` to place the request in its tree
(`engine.api.trees`), runs the reply on its `EngineSide` (whoever owns the engine: both reply
through `engine.service.client.EngineClient`), and hands the outcome back to the tree side,
whose reply lifetime applies and saves it. `arbor-engine serve` has both sides to itself
(`LocalTrees`, `OwnEngine`: llama.cpp in a process of its own, restarted if it dies); in the
app they are the window's trees and the window's engine. A job whose client went away is
cancelled: its reply stops within one token, or it never starts.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from engine.api.calls import CallDelta, CallStream
from engine.api.schema import ApiError, ChatRequest, Usage
from engine.api.stops import StopScanner
from engine.config.params import SamplingParams
from engine.core.call_formats import FORMATS, ToolFormat
from engine.core.errors import ArborError, Cancelled, EngineCrashed
from engine.core.results import (
    FailureKind,
    FinishReason,
    Outcome,
    ReplyFailure,
    ReplyReport,
    ReplyResult,
    Stopped,
    TokenLogprob,
)
from engine.core.tools import TOOL_CALLS, ToolCall, calls_of
from engine.core.tree import Node
from engine.llm.reply import CancelFn, PieceFn
from engine.service.protocol import ModelLoaded

log = logging.getLogger(__name__)

MAX_QUEUE = 16
IDLE_CHECK_S = 1.0


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Answer:
    """A finished reply as the API answers it."""

    text: str
    finish: str  # OpenAI's finish_reason: "stop", "length" or "tool_calls"
    usage: Usage
    calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None  # None: not asked for


Delivery = Text | CallDelta | Answer | ApiError


@dataclass(frozen=True)
class ApiStats:
    """What the engine did for the API since the server started (`GET /arbor/stats`)."""

    requests: int = 0
    prompt_tokens: int = 0
    decoded: int = 0  # prompt tokens decoded while a client waited
    warm_decoded: int = 0  # decoded by warm-ups, while no request waited
    warming: bool = False


@dataclass
class Job:
    request: ChatRequest
    deliver: Callable[[Delivery], None]  # called on the worker thread
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Begun:
    """A request placed in its tree, its reply node made: what the engine needs."""

    token: object  # the tree side's own handle on the reply (its lifetime)
    path: tuple[Node, ...]  # private copies: root .. the message to answer
    seed: int
    conversation_id: int  # the engine keys the path's checkpoints by it (0: none yet)
    resume: Node | None = None  # a private copy of the reply a prefill goes on with


class TreeSide(Protocol):
    """Where API conversations live (see engine.api.trees)."""

    def begin(self, request: ChatRequest, model: str, base_seed: int | None) -> Begun: ...

    def finish(self, begun: Begun, outcome: Outcome, streamed: str, cut: str | None
               ) -> list[Node]:
        """Apply how the reply ended (engine.service.lifetime's policy: the text `streamed`
        to the client is kept, even when it failed) and save it; `cut`: its text ended at a
        stop sequence there. A request whose reply said nothing leaves its tree as it was.
        Returns the branch to warm while idle (none after a failure)."""

    def close(self) -> None: ...


class EngineSide(Protocol):
    def loaded(self) -> ModelLoaded | None: ...

    def wait_turn(self, cancel: CancelFn) -> None:
        """Return when this side may place and run a request (raise Cancelled if `cancel`
        says so first): at once, or once a window sharing the engine has no reply running."""

    def sampling(self) -> SamplingParams: ...

    def base_seed(self) -> int | None: ...

    def reply(self, path: Sequence[Node], *, max_tokens: int, seed: int, on_piece: PieceFn,
              cancel: CancelFn, sampling: SamplingParams, scope: str,
              conversation_id: int, resume: Node | None = None) -> Outcome:
        """`resume`: a reply to the last node of `path` to go on with (its pieces are the new
        text only). `scope`: the request's cache scope (ChatRequest.scope): the engine reuses only
        that scope's state, so what it reports as cached is the client's own. A reply the
        engine's owner took back fails as `FailureKind.PREEMPTED`: its client gets a 503, or,
        once its stream has begun, the stream ends with that error."""

    def warm_while(self, path: Sequence[Node], idle: Callable[[], bool], scope: str
                   ) -> ReplyReport | None: ...

    def recover(self) -> None:
        """After the engine died under a request."""

    def check(self) -> None:
        """While no request runs: notice an engine that died or stopped answering, and
        start it again (or let whoever owns it)."""

    def close(self) -> None: ...


class ApiWorker:
    """`start()`, then `submit` from any thread; `close()` ends it (queued jobs get 503)."""

    def __init__(self, trees: Callable[[], TreeSide], engine: EngineSide, *,
                 max_queue: int = MAX_QUEUE) -> None:
        self.engine = engine
        self._new_trees = trees  # made on the worker thread (a store connection is per thread)
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._warm_path: list[Node] = []
        self._current: Job | None = None  # the job being answered
        self._stopping = False
        self._ended = False  # the end marker is queued
        self._warm_scope = ""  # the cache scope of the request that path answered
        self.stats = ApiStats()  # replaced whole, so any thread reads a consistent one

    # --- any thread --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="arbor-api-worker", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure

    def submit(self, job: Job) -> None:
        if self._stopping:
            raise _shutting_down()
        if self.engine.loaded() is None:
            raise ApiError(503, "no model is loaded", type="server_error")
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise ApiError(429, f"the server is busy: {self._queue.maxsize} requests are "
                                "waiting for the model; try again shortly",
                           type="rate_limit_error", code="queue_full") from None

    def stop(self) -> None:
        """Take no more requests: those waiting are answered 503 and the one running is
        stopped (within a token). Returns at once; `close` waits for the thread."""
        self._stopping = True
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:  # the end marker: it stays the last thing queued
                self._queue.put(None)
                break
            job.deliver(_shutting_down())
        current = self._current
        if current is not None:
            current.cancelled.set()
            # Its client is told now: an engine that stopped answering would hold the
            # answer back until it is declared dead. What the worker delivers later goes
            # to nobody.
            current.deliver(_shutting_down())

    def close(self, timeout: float | None = None) -> bool:
        """`stop`, then wait for the worker thread to end, at most `timeout` seconds (None:
        for as long as it takes). Whether it ended; if not, call again once whatever held
        it (an engine that stopped answering) has been ended."""
        if self._thread is None:
            return True
        self.stop()
        if not self._ended:
            self._ended = True
            self._queue.put(None)  # the queue was just emptied: there is room
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        self._thread = None
        return True

    # --- the worker thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            trees = self._new_trees()
        except BaseException as exc:  # reported to start()
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        while (job := self._next_job()) is not None:
            if job.cancelled.is_set():
                continue
            self._current = job  # before the check: `stop` sets the flag, then reads this
            if self._stopping:
                self._current = None
                job.deliver(_shutting_down())
                continue
            try:
                job.deliver(self._answer(job, trees))
            except ApiError as error:
                job.deliver(error)
            except Exception:  # a bug: the client gets a 500, the server goes on
                log.exception("an API request failed")
                job.deliver(ApiError(500, "an internal error stopped the reply",
                                     type="server_error"))
            self._current = None
            if not self._stopping:
                self._warm()
        trees.close()

    def _next_job(self) -> Job | None:
        """The next job; while there is none, the engine is checked every IDLE_CHECK_S (one
        that died or went silent while idle is started again before a client finds it)."""
        while True:
            try:
                return self._queue.get(timeout=IDLE_CHECK_S)
            except queue.Empty:
                if not self._stopping:
                    self.engine.check()

    def _answer(self, job: Job, trees: TreeSide) -> Answer:
        request, engine = job.request, self.engine
        loaded = engine.loaded()
        if loaded is None:
            raise ApiError(503, "the model is not loaded (the engine stopped)",
                           type="server_error")
        try:
            engine.wait_turn(job.cancelled.is_set)
        except Cancelled:
            raise ApiError(499, "the client went away", type="cancelled") from None
        identity = loaded.identity
        try:
            begun = trees.begin(request, identity.model_sha256 if identity else loaded.path,
                                request.seed if request.seed is not None
                                else engine.base_seed())
        except ArborError as exc:  # the store: locked past its timeout, a full disk
            raise _not_saved(exc) from None
        stops = StopScanner(request.stop)
        sampling = request.sampling(engine.sampling())
        held = CallStream(_formats(loaded), tools=json.loads(request.tools),
                          parallel=sampling.parallel_tool_calls) if request.tools else None
        streamed: list[str] = []

        def show(text: str) -> None:
            deltas: list[CallDelta] = []
            if held is not None:
                text, deltas = held.feed(text)
            if text:
                job.deliver(Text(text))
            for delta in deltas:
                job.deliver(delta)

        def on_piece(piece: str) -> None:
            streamed.append(piece)
            show(stops.feed(piece))

        outcome = engine.reply(
            begun.path, max_tokens=request.max_tokens or loaded.n_ctx, seed=begun.seed,
            on_piece=on_piece, sampling=sampling, scope=request.scope,
            conversation_id=begun.conversation_id,
            cancel=lambda: job.cancelled.is_set() or stops.hit, resume=begun.resume)
        before = begun.resume.text if begun.resume is not None else ""  # not said again
        if isinstance(outcome, ReplyResult):
            if not stops.hit:
                show(stops.flush())
            else:  # cut at a stop sequence: the node keeps the text the client got
                outcome = replace(outcome, text=before + stops.text,
                                  report=replace(outcome.report, finish=FinishReason.STOP))
            if held is not None:  # the calls' deltas still owed; the ids they gave are kept
                owed, made = held.finish(calls_of(dict(outcome.meta)))
                for delta in owed:
                    job.deliver(delta)
                if made:
                    outcome = replace(outcome, meta=tuple(
                        (key, [c.to_meta() for c in made] if key == TOOL_CALLS else value)
                        for key, value in outcome.meta))
        try:
            warm = trees.finish(begun, outcome, "".join(streamed),
                                stops.text if stops.hit else None)
        except ArborError as exc:  # taken back: the tree is as it was before the request
            raise _not_saved(exc) from None
        if not isinstance(outcome, ReplyResult):
            if isinstance(outcome, ReplyFailure) and outcome.kind in (FailureKind.ENGINE_DIED,
                                                                      FailureKind.KERNELS):
                engine.recover()
            raise _api_error(outcome)
        result = outcome
        self._warm_path = warm
        self._warm_scope = request.scope
        report = result.report
        self.stats = replace(self.stats, requests=self.stats.requests + 1,
                             prompt_tokens=self.stats.prompt_tokens + report.prompt_tokens,
                             decoded=self.stats.decoded + report.decoded_tokens)
        said = result.text
        if before:
            said = said[len(before):] if said.startswith(before) else "".join(streamed)
        calls = calls_of(dict(result.meta))
        if held is not None and said.startswith(held.shown) and len(said) > len(held.shown):
            job.deliver(Text(said[len(held.shown):]))  # held back, and not a call after all
        finish = ("tool_calls" if calls else "length"
                  if report.finish in (FinishReason.LENGTH, FinishReason.CONTEXT_FULL)
                  else "stop")
        logprobs = None
        if sampling.top_logprobs is not None:  # the tokens of the text the client got
            logprobs = _within(result.logprobs, len(stops.text)) if stops.hit \
                else result.logprobs
        return Answer(
            text=said, finish=finish, calls=calls, logprobs=logprobs,
            usage=Usage(report.prompt_tokens, report.generated_tokens, report.reused_tokens))

    def _warm(self) -> None:
        """While no request waits, decode the branch just answered, its reply included, as
        the window does while its user reads: the client's next turn then decodes only its
        new message. (A reply's tokens came from one-token decodes; the exact state after
        it is the one a batch decode of the whole branch gives.) A request that arrives
        makes the warm-up stale; it stops within a chunk."""
        path, self._warm_path = self._warm_path, []
        if not path or not self._queue.empty():
            return
        self.stats = replace(self.stats, warming=True)
        try:
            report = self.engine.warm_while(path, self._queue.empty, self._warm_scope)
        except ArborError as exc:  # only an optimisation; a dead engine is restarted
            log.warning("warm-up failed: %s", exc)
            if isinstance(exc, EngineCrashed):
                self.engine.recover()
            report = None
        self.stats = replace(self.stats, warming=False, warm_decoded=self.stats.warm_decoded
                             + (report.decoded_tokens if report is not None else 0))


def _formats(loaded: ModelLoaded) -> tuple[ToolFormat, ...]:
    """The call format the model's chat template writes (all that Arbor knows where the
    engine did not say: the markers and what follows them tell)."""
    return tuple(f for f in FORMATS if f.name == loaded.tool_format) or FORMATS


def _within(logprobs: tuple[TokenLogprob, ...], chars: int) -> tuple[TokenLogprob, ...]:
    """The first tokens whose text fits in `chars` characters (a reply cut at a stop)."""
    kept: list[TokenLogprob] = []
    length = 0
    for token in logprobs:
        length += len(token.text)
        if length > chars:
            break
        kept.append(token)
    return tuple(kept)


def _not_saved(exc: ArborError) -> ApiError:
    return ApiError(503, f"the conversation could not be saved ({exc}); nothing of this "
                         "request was kept, try again", type="server_error")


def _shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", type="server_error")


def _api_error(outcome: Stopped | ReplyFailure) -> ApiError:
    if isinstance(outcome, Stopped):
        return ApiError(499, "the client went away", type="cancelled")
    match outcome.kind:
        case FailureKind.OVERFLOW:
            return ApiError(400, outcome.message, param="messages",
                            code="context_length_exceeded")
        case FailureKind.ENGINE_DIED | FailureKind.KERNELS:
            return ApiError(503, f"{outcome.message}; the model is being loaded again",
                            type="server_error")
        case FailureKind.PREEMPTED:
            return ApiError(503, outcome.message, type="server_error", code="preempted")
        case FailureKind.UNSUPPORTED:
            return ApiError(400, outcome.message)
    return ApiError(500, outcome.message, type="server_error")
