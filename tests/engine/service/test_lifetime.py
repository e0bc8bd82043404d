"""A reply's lifetime on the one engine client, driven by a scripted engine (no model): the
outcome of every kind reaches the caller, and the one failure policy keeps what was said."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from engine.core.conversation import Conversation, ReplyJob
from engine.core.errors import Cancelled, EngineCrashed
from engine.core.results import (
    FailureKind,
    FinishReason,
    Outcome,
    ReplyFailure,
    ReplyReport,
    ReplyResult,
    Source,
    Stopped,
)
from engine.core.tree import Node, NodeStatus, Role, Tree
from engine.service.client import ClientKind, EngineClient, outcome_result
from engine.service.control import Control
from engine.service.lifetime import ReplyRun
from engine.service.protocol import Event, Finished, GenerateRequest, Piece, Request

REPORT = ReplyReport(4, 0, 4, Source.NONE, None, 1.0, finish=FinishReason.STOP)


class Scripted:
    """An engine that answers every reply with `pieces`, then `end` (or, with `end` None,
    the pieces as a finished result). With `until_stopped`, it says its pieces and waits
    for the stop, then ends `Stopped`."""

    def __init__(self, emit: Callable[[Event], None], control: Control, pieces: Sequence[str],
                 end: Outcome | None, until_stopped: bool) -> None:
        self.emit, self.control, self.pieces, self.end = emit, control, pieces, end
        self.until_stopped = until_stopped

    def handle(self, request: Request) -> None:
        assert isinstance(request, GenerateRequest)
        rid, cid, reply = request.request_id, request.conversation_id, request.reply_id
        for piece in self.pieces:
            self.emit(Piece(rid, cid, reply, piece))
        if self.until_stopped:
            while not self.control.stop_requested(rid):
                time.sleep(0.001)
            self.emit(Finished(rid, cid, reply, Stopped()))
            return
        path_ids = [view.id for view in request.path]
        end = self.end or ReplyResult("".join(self.pieces), (1, 2), (), ((path_ids[-1], (7,)),),
                                      REPORT)
        self.emit(Finished(rid, cid, reply, end))


def client(pieces: Sequence[str], end: Outcome | None = None, *,
           until_stopped: bool = False) -> EngineClient:
    return EngineClient.make(ClientKind.IN_PROCESS, handler=lambda emit, control: Scripted(
        emit, control, pieces, end, until_stopped))


def start(kept: list[tuple[list[int], list[int]]]) -> tuple[Conversation, ReplyRun]:
    conversation = Conversation(Tree("S"))
    change = conversation.send("Hello")
    assert change.reply is not None

    def keep(nodes: Sequence[Node], deleted: Sequence[int]) -> None:
        kept.append(([n.id for n in nodes], list(deleted)))

    return conversation, ReplyRun.begin(conversation, ReplyJob(change.reply.parent), keep)


def test_a_finished_reply_is_streamed_then_applied_and_kept() -> None:
    engine, kept = client(["Hi", " there"]), []
    conversation, run = start(kept)
    streamed: list[str] = []
    outcome = run.run(engine, run.request(engine.next_id(), max_tokens=8, seed=1),
                      on_piece=streamed.append)
    assert streamed == ["Hi", " there"]
    result = outcome_result(outcome)
    reply = conversation.tree.node(run.reply.id)
    assert reply.text == result.text == "Hi there" and reply.status is NodeStatus.COMPLETE
    assert reply.tokens == (1, 2)
    assert conversation.tree.node(reply.parent or 0).tokens == (7,)  # rendered: kept
    assert kept[0] == ([run.reply.id], []) and run.reply.id in kept[-1][0]
    engine.shutdown()


def test_a_failure_keeps_what_was_streamed_as_interrupted_with_its_rendered_tokens() -> None:
    kept: list[tuple[list[int], list[int]]] = []
    conversation, run = start(kept)
    asked = conversation.tree.node(run.start.path[-1].id)
    engine = client(["Half an ans"], ReplyFailure(FailureKind.ENGINE_DIED, "it died",
                                                  rendered=((asked.id, (9, 9)),)))
    outcome = run.run(engine, run.request(engine.next_id(), max_tokens=8, seed=1))
    assert isinstance(outcome, ReplyFailure)
    reply = conversation.tree.node(run.reply.id)
    assert reply.text == "Half an ans" and reply.status is NodeStatus.INTERRUPTED
    assert asked.tokens == (9, 9)
    assert isinstance(outcome.error(), EngineCrashed)
    engine.shutdown()


def test_a_reply_that_said_nothing_is_taken_back_whatever_ended_it() -> None:
    for end in (Stopped(), ReplyFailure(FailureKind.ERROR, "no")):
        kept: list[tuple[list[int], list[int]]] = []
        conversation, run = start(kept)
        engine = client([], end)
        outcome = run.run(engine, run.request(engine.next_id(), max_tokens=8, seed=1))
        assert outcome == end and run.taken_back
        assert kept[-1] == ([], [run.reply.id])
        assert [n.role for n in conversation.tree.active_path()] == [Role.SYSTEM, Role.USER]
        engine.shutdown()


def test_a_stop_reaches_the_engine_and_comes_back_as_the_outcome() -> None:
    kept: list[tuple[list[int], list[int]]] = []
    _conversation, run = start(kept)
    engine = client(["a"], until_stopped=True)
    pieces: list[str] = []
    outcome = run.run(engine, run.request(engine.next_id(), max_tokens=8, seed=1),
                      on_piece=pieces.append, cancel=lambda: len(pieces) >= 1)
    assert isinstance(outcome, Stopped) and run.reply.status is NodeStatus.INTERRUPTED
    try:
        outcome_result(outcome)
    except Cancelled:
        pass
    else:
        raise AssertionError("a stop is raised as Cancelled to a blocking caller")
    engine.shutdown()
