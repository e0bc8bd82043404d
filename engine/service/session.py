"""The facade the app and the command line use: one conversation tree on one runtime.

Every operation a user can do to a conversation is a method here, and every method that runs
the model returns a `StepReport` saying exactly what was reused and what was decoded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from engine.config.params import SamplingParams
from engine.core.attachments import Document
from engine.core.conversation import Change, Conversation, ReplyJob
from engine.core.errors import Cancelled
from engine.core.overflow import Overflow
from engine.core.results import ReplyReport, ReplyResult
from engine.core.schedule import DEFAULT_INTERVAL
from engine.core.tools import calls_of
from engine.core.tree import Node, Role, Tree, TreeError
from engine.llm.generator import Generator
from engine.llm.runtime import CancelFn, ProgressFn, Runtime
from engine.service.client import ClientKind, EngineClient, outcome_result
from engine.service.handler import EngineService
from engine.service.lifetime import ReplyRun
from engine.storage.checkpoints import CheckpointStore

log = logging.getLogger(__name__)

TextFn = Callable[[str], None]


class Sink(Protocol):
    """Where a session's changes go to be kept (the store). Each call is one transaction."""

    def action(self, tree: Tree, nodes: Sequence[Node], deleted: Sequence[int] = ()) -> None: ...

    def streaming(self, node: Node) -> None:
        """A growing reply; may be throttled (the store saves it about once a second)."""

    def forked(self, tree: Tree) -> Sink:
        """Where a fork of the conversation (a new one, holding `tree`) is kept."""


@dataclass(frozen=True)
class StepReport:
    """What one operation did: `report` says what the engine did (None: no model ran), and
    `text` is what a reply said (for a continued reply, what it added)."""

    op: str
    node_id: int | None = None
    text: str | None = None
    report: ReplyReport | None = None


@dataclass
class GenerationOptions:
    max_tokens: int = 512
    seed: int | None = None  # None: the session's seed plus its generation count
    on_progress: ProgressFn | None = None
    on_text: TextFn | None = None
    cancel: CancelFn | None = None
    # "required" or a tool's name: the reply must call one (engine.core.tools); None: free.
    tool_choice: str | None = None


class Session:
    """A conversation tree bound to a runtime (or, with `replier`, to an engine elsewhere).

    `use_cache=False` clears the context before every prompt and decodes it whole: the
    reference every cached answer must equal.
    """

    def __init__(
        self,
        runtime: Runtime | None,
        tree: Tree | None = None,
        *,
        system: str = "",
        sampling: SamplingParams | None = None,
        seed: int = 0,
        use_cache: bool = True,
        checkpoints: CheckpointStore | None = None,
        checkpoint_interval: int = DEFAULT_INTERVAL,
        sink: Sink | None = None,
        template: str | None = None,
        engine: EngineClient | None = None,
        overflow: Overflow = Overflow.STOP,
    ) -> None:
        """`engine`: replies come from there (the model's settings are its business) and
        `runtime` is None; else an in-process engine on a generator on `runtime` with these
        settings. `overflow`: what a reply does when the branch outgrows the context."""
        self.runtime = runtime
        self.overflow = overflow
        self.sink = sink
        self.conversation = Conversation(tree if tree is not None else Tree(system))
        self.seed = seed
        self.sampling = sampling  # None: the engine's; a forced tool call starts from it
        self.use_cache = use_cache
        self.generator: Generator | None = None
        if engine is None:
            assert runtime is not None
            generator = self.generator = Generator(
                runtime,
                sampling=sampling,
                use_cache=use_cache,
                checkpoints=checkpoints,
                checkpoint_interval=checkpoint_interval,
                template=template,
            )
            # The runtime is the caller's: the engine's thread runs only while a request
            # does, and never closes it.
            engine = EngineClient.make(
                ClientKind.IN_PROCESS, keep_thread=False,
                handler=lambda emit, control: EngineService(emit, control, generator=generator))
        self.engine = engine
        self._model: dict[str, Any] | None = None

    @property
    def tree(self) -> Tree:
        return self.conversation.tree

    @property
    def model(self) -> dict[str, Any]:
        """What the replies come from, as `Runtime.report()` says (exports name the model)."""
        if self._model is None:
            self._model = self.runtime.report() if self.runtime is not None else {}
        return self._model

    @model.setter
    def model(self, report: dict[str, Any]) -> None:
        self._model = report

    @property
    def checkpoints(self) -> CheckpointStore | None:
        return self.generator.checkpoints if self.generator is not None else None

    @checkpoints.setter
    def checkpoints(self, store: CheckpointStore | None) -> None:
        assert self.generator is not None
        self.generator.checkpoints = store if self.use_cache else None

    # --- operations (the tree's half is engine.core.conversation, shared by every front end) -----

    def send(self, text: str, options: GenerationOptions | None = None, *,
             documents: Sequence[Document] = ()) -> StepReport:
        """Add a user message (with any documents attached) at the active leaf and
        generate its reply."""
        return self._apply("send", self.conversation.send(text, documents), options)

    def regenerate(
        self, options: GenerationOptions | None = None, *, node_id: int | None = None
    ) -> StepReport:
        """A new version of a reply (None: the active path's last one); the old is kept."""
        return self._apply("regenerate", self.conversation.regenerate(node_id), options)

    def edit(self, node_id: int, text: str, options: GenerationOptions | None = None) -> StepReport:
        """A new version of a message. A user message gets a new reply; an assistant
        message just takes the given text. The old version stays as a sibling."""
        change = self.conversation.edit(node_id, text)
        report = self._apply("edit", change, options)
        return report if change.reply is not None else replace(report, text=text)

    def switch(self, node_id: int, variant: int) -> StepReport:
        return self._apply("switch", self.conversation.switch(node_id, variant))

    def activate(self, node_id: int) -> StepReport:
        return self._apply("activate", self.conversation.activate(node_id))

    def warm(self, options: GenerationOptions | None = None) -> StepReport:
        """What the app does while the user reads: prepare the likely next prompt, so the
        next message decodes only itself, or a Continue of an interrupted reply nothing
        (see Generator.warm)."""
        max_tokens = (options or GenerationOptions()).max_tokens
        path, resume = self.conversation.warm_target()
        report, tokens = self.engine.warm(path, resume=resume, max_tokens=max_tokens,
                                          overflow=self.overflow)
        if report is not None:
            # The engine spills checkpoints after a request's last event; a session's
            # callers read its store and runtime once a step returns.
            self.engine.sync()
        self._keep(self.conversation.adopt_tokens(tokens))
        return StepReport(op="warm", node_id=self.tree.active_leaf, report=report)

    def rewind(self, node_id: int) -> StepReport:
        return self._apply("rewind", self.conversation.rewind(node_id), node_id=node_id)

    def delete_branch(self, node_id: int) -> StepReport:
        change = self.conversation.delete_branch(node_id)
        report = self._apply("delete", change)
        self.engine.forget(change.deleted)
        return report

    def undo(self) -> StepReport:
        """Bring back the last deleted branch."""
        return self._apply("undo", self.conversation.undo())

    def set_tools(self, tools: list[dict[str, Any]]) -> StepReport:
        """The tools the conversation offers the model (OpenAI's function tools)."""
        return self._apply("tools", self.conversation.set_tools(tools, {}))

    def answer_calls(self, texts: Sequence[str], options: GenerationOptions | None = None
                     ) -> StepReport:
        """The results of the active reply's calls, in order, and the model's answer."""
        reply = self.tree.node(self.tree.active_leaf)
        calls = calls_of(reply.meta)
        if reply.role is not Role.ASSISTANT or len(calls) != len(texts):
            raise TreeError(f"the active reply made {len(calls)} tool calls; "
                            f"{len(texts)} results were given")
        change = self.conversation.answer_calls(reply.id, list(zip(calls, texts, strict=True)))
        return self._apply("results", change, options)

    def set_system(self, text: str) -> StepReport:
        return self._apply("system", self.conversation.set_system(text), text=text)

    def fork(self, node_id: int) -> StepReport:
        """Go on in a new conversation holding the path to `node_id` (the sink, if it can,
        keeps it as a new conversation)."""
        tree = self.conversation.fork(node_id)
        self.conversation = Conversation(tree)
        if self.sink is not None:
            self.sink = self.sink.forked(tree)
        return StepReport(op="fork", node_id=tree.active_leaf)

    def continue_reply(self, options: GenerationOptions | None = None) -> StepReport:
        """Generate a reply to the active leaf if it is a user message (after a rewind)."""
        if self.tree.node(self.tree.active_leaf).role is not Role.USER:
            raise TreeError("the active message is not a user message")
        return self._apply("reply", self.conversation.continue_reply(), options)

    def resume(self, node_id: int, options: GenerationOptions | None = None) -> StepReport:
        """Continue an assistant reply where it stopped (an interrupted one, typically)."""
        if self.tree.node(node_id).role is not Role.ASSISTANT:
            raise TreeError("only an assistant reply can be continued")
        return self._apply("continue", self.conversation.continue_reply(node_id), options)

    # --- the work ----------------------------------------------------------------------

    def _apply(
        self,
        op: str,
        change: Change,
        options: GenerationOptions | None = None,
        *,
        node_id: int | None = None,
        text: str | None = None,
    ) -> StepReport:
        """Persist a change, then run its reply job, if any."""
        self._keep(list(change.nodes), deleted=change.deleted)
        job = change.reply
        if job is None:
            if node_id is None:
                node_id = change.nodes[-1].id if change.nodes else self.tree.active_leaf
            return StepReport(op=op, node_id=node_id, text=text)
        return self._reply(op, job, options or GenerationOptions())

    def _reply(self, op: str, job: ReplyJob, options: GenerationOptions) -> StepReport:
        """Run a reply job through its lifetime (engine.service.lifetime), as every front
        end does; a failure is raised once its policy has been applied."""
        seed = self.conversation.reply_seed(self.seed)
        if options.seed is not None:
            seed = options.seed
        run = ReplyRun.begin(self.conversation, job, self._keep,
                             streaming=self.sink.streaming if self.sink is not None
                             else lambda _node: None)
        sampling = None
        if options.tool_choice is not None:
            sampling = replace(self.sampling or SamplingParams(), tool_choice=options.tool_choice)
        outcome = run.run(
            self.engine, run.request(self.engine.next_id(), max_tokens=options.max_tokens,
                                     seed=seed, overflow=self.overflow, sampling=sampling),
            on_piece=options.on_text, on_progress=options.on_progress, cancel=options.cancel)
        if isinstance(outcome, ReplyResult):
            self.engine.sync()  # its spills too (they follow the reply's end): see `warm`
        result = outcome_result(outcome)
        return StepReport(op=op, node_id=run.reply.id,
                          text=result.text[len(run.start.was_text):], report=result.report)

    def _keep(self, nodes: Sequence[Node], deleted: Sequence[int] = ()) -> None:
        if self.sink is not None:
            self.sink.action(self.tree, nodes, deleted)


__all__ = ["Cancelled", "GenerationOptions", "Session", "StepReport"]
