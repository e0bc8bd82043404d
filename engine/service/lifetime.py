"""A reply's lifetime, for every front end: start, persist, stream, finish or fail, persist.

`ReplyRun` is the one object that applies a reply to its conversation: the window (events on
the GUI thread), the command line (`Session`, blocking) and the local API (its trees) each
make one per reply job and hand it what the engine says. What they keep (the store, a sink,
nothing) is theirs: `keep` persists a change in one transaction and may raise ArborError;
`streaming` saves a growing reply, at most about once a second.

The failure policy, one for all (see `ReplyRun.finish`): a demanding user never loses text
that was streamed to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.config.params import SamplingParams
from engine.core.conversation import Change, Conversation, ReplyJob, ReplyStart
from engine.core.overflow import Overflow
from engine.core.reasoning import OPENED
from engine.core.results import NodeView, Outcome, ReplyResult, Stopped
from engine.core.tree import Node
from engine.llm.reply import CancelFn, PieceFn, ProgressFn
from engine.service.client import EngineClient, generate_request
from engine.service.protocol import Finished, GenerateRequest, Piece

Keep = Callable[[Sequence[Node], Sequence[int]], None]
Streaming = Callable[[Node], None]


def _not_streamed(_node: Node) -> None:
    pass


class ReplyRun:
    """One reply job under way on `conversation` (`conversation_id` names its nodes to the
    engine). Not thread-safe: one thread (the conversation's owner) calls everything."""

    def __init__(self, conversation: Conversation, start: ReplyStart, keep: Keep,
                 streaming: Streaming, conversation_id: int) -> None:
        self.conversation = conversation
        self.start = start
        self.conversation_id = conversation_id
        self._keep = keep
        self._streaming = streaming
        self.pieces = 0  # pieces streamed so far
        self.outcome: Outcome | None = None  # once finished

    @classmethod
    def begin(cls, conversation: Conversation, job: ReplyJob, keep: Keep, *,
              conversation_id: int = 0, streaming: Streaming = _not_streamed,
              with_nodes: Sequence[Node] = ()) -> ReplyRun:
        """The reply exists, streaming, and is kept (with `with_nodes`, in the same
        transaction) before the engine sees the request. If it cannot be kept, it is taken
        back and the error raised."""
        start = conversation.start_reply(job)
        try:
            keep([*with_nodes, start.reply], ())
        except BaseException:
            conversation.fail_reply(start)
            raise
        return cls(conversation, start, keep, streaming, conversation_id)

    @property
    def reply(self) -> Node:
        return self.start.reply

    def request(self, request_id: int, *, max_tokens: int, seed: int,
                sampling: SamplingParams | None = None, overflow: Overflow = Overflow.STOP,
                scope: str = "") -> GenerateRequest:
        """What the engine needs: copies of the path, never the nodes."""
        start = self.start
        return generate_request(
            request_id, [NodeView.of(node) for node in start.path],
            resume=NodeView.of(start.resume) if start.resume is not None else None,
            max_tokens=max_tokens, seed=seed, conversation_id=self.conversation_id,
            sampling=sampling, overflow=overflow, scope=scope)

    # --- what the engine says ----------------------------------------------------------------

    def piece(self, text: str, *, opened: bool = False) -> Node:
        """Text the reply said: shown at once, kept at most about a second behind."""
        reply = self.start.reply
        reply.text += text
        if opened:
            reply.meta[OPENED] = True  # the finished reply's meta says so too
        self.pieces += 1
        self._streaming(reply)
        return reply

    def on_event(self, event: object) -> Outcome | None:
        """A front end that reads events itself (the window): the outcome once it ends."""
        match event:
            case Piece():
                self.piece(event.text, opened=event.reasoning_opened)
            case Finished():
                self.finish(event.outcome)
                return event.outcome
        return None

    def finish(self, outcome: Outcome, *, amend: Callable[[Node], None] | None = None
               ) -> Change:
        """Apply how the reply ended and keep it. The one failure policy:

        - a result (finished, or stopped after it said something) is the reply;
        - a stop before it said anything, or any failure (an error, the engine's death, the
          engine taken back by its owner), keeps what the reply had said as interrupted,
          to be continued, and takes back a reply that said nothing (a continued reply gets
          its old status back);
        - whatever ended it, path nodes the engine rendered keep their tokens.

        So a user never loses text that was streamed to them, and no empty reply is left
        behind. `amend` changes the reply before it is kept (the API's cut at a stop
        sequence)."""
        self.outcome = outcome
        conversation = self.conversation
        reply = self.start.reply
        if isinstance(outcome, ReplyResult):
            if reply.id not in conversation.tree:
                return Change()
            change = conversation.finish_reply(reply.id, outcome)
            if amend is not None and reply.id in conversation.tree:
                amend(reply)
        else:
            rendered = conversation.adopt_tokens(outcome.rendered)
            failed = conversation.fail_reply(self.start)
            change = Change(nodes=(*rendered, *failed.nodes), deleted=failed.deleted)
        if change.nodes or change.deleted:
            self._keep(change.nodes, change.deleted)
        return change

    @property
    def taken_back(self) -> bool:
        """The reply left nothing behind (it said nothing before it ended)."""
        return self.start.reply.id not in self.conversation.tree

    # --- blocking: the command line's and the API's ------------------------------------------

    def run(self, engine: EngineClient, request: GenerateRequest, *,
            on_piece: PieceFn | None = None, on_progress: ProgressFn | None = None,
            cancel: CancelFn | None = None) -> Outcome:
        """Send the reply, stream it here, apply its outcome (`finish`), and return it."""

        def piece(text: str) -> None:
            self.piece(text)
            if on_piece is not None:
                on_piece(text)

        try:
            outcome = engine.reply(request, on_piece=piece, on_progress=on_progress,
                                   cancel=cancel)
        except BaseException:  # Ctrl+C in a terminal, a callback's bug: a stop, as for Esc
            self.finish(Stopped())
            raise
        self.finish(outcome)
        return outcome
