"""The facade the app and the command line use: one conversation tree on one runtime.

Every operation a user can do to a conversation is a method here, and every method that runs
the model returns a `StepReport` saying exactly what was reused and what was decoded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from engine.checkpoints import DEFAULT_INTERVAL, CheckpointStore
from engine.conversation import Change, Conversation
from engine.errors import Cancelled
from engine.generator import Generator
from engine.params import SamplingParams
from engine.runtime import (
    CancelFn,
    FinishReason,
    Generation,
    PrepareReport,
    ProgressFn,
    Runtime,
    Source,
)
from engine.tree import Node, NodeStatus, Role, Tree, TreeError

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
    """What one operation did. Prompt fields are None when the step ran no model."""

    op: str
    node_id: int | None = None
    prompt_tokens: int | None = None
    reused_tokens: int | None = None
    decoded_tokens: int | None = None
    source: Source | None = None
    checkpoint_pos: int | None = None
    prefill_ms: float | None = None
    ttft_ms: float | None = None
    generated_tokens: int | None = None
    text: str | None = None
    finish: FinishReason | None = None


@dataclass
class GenerationOptions:
    max_tokens: int = 512
    seed: int | None = None  # None: the session's seed plus its generation count
    on_progress: ProgressFn | None = None
    on_text: TextFn | None = None
    cancel: CancelFn | None = None


class Session:
    """A conversation tree bound to a runtime.

    `use_cache=False` clears the context before every prompt and decodes it whole: the
    reference every cached answer must equal.
    """

    def __init__(
        self,
        runtime: Runtime,
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
    ) -> None:
        self.runtime = runtime
        self.sink = sink
        self.conversation = Conversation(tree if tree is not None else Tree(system))
        self.seed = seed
        self.use_cache = use_cache
        self.generator = Generator(
            runtime,
            sampling=sampling,
            use_cache=use_cache,
            checkpoints=checkpoints,
            checkpoint_interval=checkpoint_interval,
            template=template,
        )

    @property
    def tree(self) -> Tree:
        return self.conversation.tree

    @property
    def checkpoints(self) -> CheckpointStore | None:
        return self.generator.checkpoints

    @checkpoints.setter
    def checkpoints(self, store: CheckpointStore | None) -> None:
        self.generator.checkpoints = store if self.use_cache else None

    # --- operations (the tree's half is engine.conversation, shared by every front end) -----

    def send(self, text: str, options: GenerationOptions | None = None) -> StepReport:
        """Add a user message at the active leaf and generate its reply."""
        return self._apply("send", self.conversation.send(text), options)

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

    def warm(self) -> StepReport:
        """What the app does while the user reads: prepare the active branch, so the next
        message decodes only itself (see Generator.warm)."""
        path = self.tree.active_path()
        untokenized = [node for node in path if node.tokens is None]
        report = self.generator.warm(path)
        self._keep([node for node in untokenized if node.tokens is not None])
        if report is None:
            return StepReport(op="warm", node_id=self.tree.active_leaf, decoded_tokens=0)
        return StepReport(
            op="warm", node_id=self.tree.active_leaf, prompt_tokens=report.prompt_tokens,
            reused_tokens=report.reused_tokens, decoded_tokens=report.decoded_tokens,
            source=report.source, checkpoint_pos=report.checkpoint_pos,
            prefill_ms=report.prefill_ms,
        )

    def rewind(self, node_id: int) -> StepReport:
        return self._apply("rewind", self.conversation.rewind(node_id), node_id=node_id)

    def delete_branch(self, node_id: int) -> StepReport:
        change = self.conversation.delete_branch(node_id)
        report = self._apply("delete", change)
        self.generator.forget(change.deleted)
        return report

    def undo(self) -> StepReport:
        """Bring back the last deleted branch."""
        return self._apply("undo", self.conversation.undo())

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
        resume = self.tree.node(job.resume) if job.resume is not None else None
        return self._reply(op, options or GenerationOptions(), resume=resume)

    def _reply(
        self, op: str, options: GenerationOptions, *, resume: Node | None = None
    ) -> StepReport:
        """Prepare the prompt and generate: a new reply as the active leaf, or more of
        `resume`'s text. As in the window, the reply exists (streaming, saved) before the
        prompt is prepared; a prepare that fails takes it back."""
        path = self.tree.active_path() if resume is None else self.tree.path_to(
            resume.parent if resume.parent is not None else resume.id
        )
        untokenized = [node for node in path if node.tokens is None]
        seed = self.conversation.reply_seed(self.seed)
        if options.seed is not None:
            seed = options.seed
        if resume is None:
            reply = self.tree.add_child(path[-1].id, Role.ASSISTANT, "",
                                        status=NodeStatus.STREAMING)
            was = NodeStatus.STREAMING
        else:
            reply, was = resume, resume.status
            reply.status = NodeStatus.STREAMING
        self._keep([reply])
        try:
            prepared = self.generator.prepare(
                path, resume=resume, on_progress=options.on_progress, cancel=options.cancel
            )
        except BaseException:
            if resume is None:
                self._keep([], deleted=self.tree.delete_branch(reply.id))
            else:
                reply.status = was
                self._keep([reply])
            raise
        # The tokens a node got now are the ones it keeps (its prefix must never change):
        # saved at once, as the window saves them.
        self._keep([node for node in untokenized if node.tokens is not None])
        before, base_text = list(prepared.before), prepared.base_text
        produced: list[int] = list(before)

        def on_token(token: int, piece: str) -> None:
            produced.append(token)
            reply.text += piece
            if self.sink is not None:
                self.sink.streaming(reply)
            if options.on_text:
                options.on_text(piece)

        try:
            generation = self.generator.generate(
                max_tokens=options.max_tokens, seed=seed, on_token=on_token,
                cancel=options.cancel,
            )
        except BaseException:
            self._finish_reply(reply, path, None, produced, base_text)
            raise
        self._finish_reply(reply, path, generation, [*before, *generation.tokens], base_text)
        self.generator.after_reply()
        return _report(op, reply, prepared.report, generation)

    def _finish_reply(
        self,
        reply: Node,
        path: list[Node],
        generation: Generation | None,
        generated: list[int] | tuple[int, ...],
        base_text: str = "",
    ) -> None:
        if generation is None or generation.finish is FinishReason.CANCELLED:
            if not reply.text and not base_text:
                # Nothing was said: leave no empty reply behind.
                self._keep([], deleted=self.tree.delete_branch(reply.id))
                return
            reply.status = NodeStatus.INTERRUPTED
        else:
            reply.status = NodeStatus.COMPLETE
        if generation is not None:
            reply.text = base_text + generation.text
        finished = self.generator.reply_tokens(path, generated, reply.text)
        reply.tokens = finished.tokens
        reply.meta.update(finished.meta())
        reply.meta["finish"] = (
            generation.finish.value if generation is not None else FinishReason.CANCELLED.value
        )
        self._keep([reply])

    def _keep(self, nodes: Sequence[Node], deleted: Sequence[int] = ()) -> None:
        if self.sink is not None:
            self.sink.action(self.tree, nodes, deleted)


def _report(op: str, reply: Node, prepared: PrepareReport, generation: Generation) -> StepReport:
    ttft = None
    if generation.ttft_ms is not None:
        ttft = prepared.prefill_ms + generation.ttft_ms
    return StepReport(
        op=op,
        node_id=reply.id,
        prompt_tokens=prepared.prompt_tokens,
        reused_tokens=prepared.reused_tokens,
        decoded_tokens=prepared.decoded_tokens,
        source=prepared.source,
        checkpoint_pos=prepared.checkpoint_pos,
        prefill_ms=prepared.prefill_ms,
        ttft_ms=ttft,
        generated_tokens=len(generation.tokens),
        text=generation.text,
        finish=generation.finish,
    )


__all__ = ["Cancelled", "GenerationOptions", "Session", "StepReport"]
