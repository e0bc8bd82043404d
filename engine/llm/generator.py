"""Generating a reply for a path of the tree: the model's half of a conversation.

`Generator` owns the runtime, the prompt builder and the checkpoint store. It reads a path of
nodes (their role, text and tokens; it fills in tokens a node does not have yet) and produces
a reply's text and tokens, but never changes the tree's shape. The engine service runs it on
copies of a path (on the engine's thread or in its process); every front end applies the
results to its tree (engine.service.lifetime).
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from engine.config.params import SamplingParams
from engine.core.errors import ContextOverflowError
from engine.core.overflow import Cut, Overflow, fit, read_part, reply_room
from engine.core.prompt import BuiltinTemplate, ChatTemplate, PromptBuilder, Template, Tokenizer
from engine.core.reasoning import OPENED, opens_reasoning, reasoning_closer
from engine.core.results import CancelFn, PlanFn, ProgressFn, TokenFn
from engine.core.schedule import DEFAULT_INTERVAL, crossing
from engine.core.templates import TemplateChoice, TemplateOrigin, choose_template
from engine.core.tree import Node, Role
from engine.llm.llama import apply_builtin_template, builtin_template_names
from engine.llm.runtime import Generation, PrepareReport, Runtime
from engine.storage.checkpoints import Checkpoint, CheckpointStore
from engine.storage.placement import INNER_MOST, plan_inner, plan_saves

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Prepared:
    """The context holds the prompt; generation can start."""

    report: PrepareReport
    before: tuple[int, ...]  # tokens the reply already has (when continuing one)
    base_text: str  # text the reply already has (when continuing one)


@dataclass(frozen=True)
class ReplyTokens:
    # As the template renders the reply in later turns (PromptBuilder.reply_tokens): mostly
    # generation prompt + generated tokens + the template's closing.
    tokens: tuple[int, ...]
    # Tokens before the closing, where a continuation starts, when the tokens start with what
    # the model read; None when the template rewrote the reply (its reasoning dropped): a
    # continuation then reads the generation prompt and the reply's text.
    open_len: int | None
    # Tokens of the generation prompt at the start, where the prompt that produced the reply
    # ended: a mark of the path's decode schedule (PromptBuilder.marks). None when the
    # template re-rendered the reply without it.
    prompt_len: int | None = None
    # The generation prompt ended with a reasoning marker: the reply's text starts inside
    # its reasoning (engine.core.reasoning.OPENED).
    reasoning_opened: bool = False

    def meta(self) -> dict[str, object]:
        """What the reply node keeps of this (its `meta`). Every key always, None included:
        a continued reply's meta is updated with these, and an earlier run's values would
        point into tokens they no longer describe."""
        return {"open_len": self.open_len, "prompt_len": self.prompt_len,
                OPENED: self.reasoning_opened}


ANSWERED = (Role.USER, Role.TOOL)  # what a reply answers: a path ending in one is a prompt


class Generator:
    def __init__(
        self,
        runtime: Runtime,
        *,
        sampling: SamplingParams | None = None,
        use_cache: bool = True,
        checkpoints: CheckpointStore | None = None,
        checkpoint_interval: int = DEFAULT_INTERVAL,
        template: str | None = None,
    ) -> None:
        """`template`: the chat template's name as the user chose it for this model
        (`engine.core.templates`); None picks the model's own, else llama.cpp's built-in one."""
        self.runtime = runtime
        self.sampling = sampling or SamplingParams()
        self.use_cache = use_cache
        self.checkpoints = checkpoints if use_cache else None
        self.checkpoint_interval = checkpoint_interval
        self.template: TemplateChoice
        self.prompts = self._prompt_builder(template)

    def use_template(self, chosen: str | None) -> TemplateChoice:
        """Render nodes that have no tokens yet with another template (None: automatic).
        Nodes that have tokens keep them: a path's prefix never changes."""
        self.prompts = self._prompt_builder(chosen)
        return self.template

    def _prompt_builder(self, chosen: str | None) -> PromptBuilder:
        model = self.runtime.model
        embedded = model.chat_template()
        self.template = choose_template(
            embedded=embedded, architecture=model.info.architecture, chosen=chosen,
            builtin=builtin_template_names(),
        )
        if self.template.origin is not TemplateOrigin.MODEL:
            log.info("%s: chat template %s", model.path.name, self.template.describe())
        template: Template
        if self.template.is_model_own and embedded is not None:
            template = ChatTemplate(embedded, bos_text=model.bos_text, eos_text=model.eos_text)
        else:
            template = BuiltinTemplate(self.template.name, apply_builtin_template)
        return PromptBuilder(template, Tokenizer(tokenize=model.tokenize, bos=model.bos,
                                                 plain=model.tokenize_plain,
                                                 controls=model.control_texts))

    # --- the three steps of a reply ------------------------------------------------------

    def prepare(
        self,
        path: Sequence[Node],
        *,
        resume: Node | None = None,
        on_progress: ProgressFn | None = None,
        on_plan: PlanFn | None = None,
        cancel: CancelFn | None = None,
        scope: str = "",
    ) -> Prepared:
        """Bring the context to the prompt for a reply after `path` (or for more of
        `resume`, a reply whose parent is path[-1]) by the cheapest valid plan that uses
        only `scope`'s state (engine.storage.checkpoints: scopes)."""
        if resume is None:
            target, marks = self.prompts.target(path), self.prompts.target_marks(path)
            before: list[int] = []
        else:
            target, marks, opened = self._continuation(path, resume)
            before = opened[len(self.prompts.generation_prompt(path)):]
        report = self._prepare(list(path), target, marks, on_progress, cancel, on_plan, scope,
                               prompt_follows=resume is None)
        return Prepared(report, tuple(before), resume.text if resume is not None else "")

    def _continuation(self, path: Sequence[Node], resume: Node
                      ) -> tuple[list[int], list[int], list[int]]:
        """The target and marks that continue `resume` (a reply to path[-1]): the path, then
        the reply's open tokens (PromptBuilder.open_reply_tokens, also returned)."""
        tokens = self.prompts.path_tokens(path)
        opened = self.prompts.open_reply_tokens(path, resume)
        opening = self.prompts.reply_opening(opened)
        if opening is None:
            marks = self.prompts.marks(path)
        else:  # as the finished reply will mark it (PromptBuilder.marks)
            marks = [*self.prompts.target_marks(path), len(tokens) + opening]
        return tokens + opened, marks, opened

    def fit(
        self,
        path: Sequence[Node],
        *,
        resume: Node | None = None,
        max_tokens: int,
        overflow: Overflow,
        tail: bool = True,
        cancel: CancelFn | None = None,
    ) -> Cut:
        """Which nodes of `path` the model reads for a reply (`engine.core.overflow`). Every node
        gets its tokens first, rendered after the whole path, so a node's tokens never depend
        on what is left out. `tail`: count the reply's prompt (False for a warm-up of the path
        alone, which prepares no generation prompt).

        Under `Overflow.STOP` the rendering stops as soon as the path is known not to fit
        (`ContextOverflowError`, counting the tokens found so far), so a path far longer than
        the context costs no more than the context's worth of it; `cancel` stops it between
        nodes (`Cancelled`)."""
        n_ctx = self.runtime.n_ctx
        limit = n_ctx if overflow is Overflow.STOP else None
        if not self.prompts.ensure_tokens(path, cancel=cancel, limit=limit):
            counted = sum(len(node.tokens) for node in path if node.tokens is not None)
            raise ContextOverflowError(counted, n_ctx)
        lengths = [len(node.tokens or ()) for node in path]
        user = [node.role is Role.USER for node in path]
        extra = 0
        if tail and overflow is not Overflow.STOP:
            extra = len(self.prompts.generation_prompt(path) if resume is None
                        else self.prompts.open_reply_tokens(path, resume))
        return fit(lengths, user, tail=extra, n_ctx=n_ctx, room=reply_room(n_ctx, max_tokens),
                   policy=overflow)

    def warm(
        self,
        path: Sequence[Node],
        *,
        resume: Node | None = None,
        cancel: CancelFn | None = None,
        max_tokens: int = 512,
        overflow: Overflow = Overflow.STOP,
        scope: str = "",
    ) -> PrepareReport | None:
        """Prepare what the next prompt will start with: `path` itself, batched (under
        `Overflow.DROP_OLDEST`, the part of it a reply would read now). With `resume` (an
        unfinished reply to path[-1]), exactly the prompt that continues it: the part of
        the path and the target `run_reply(..., resume=resume)` would prepare, with the
        logits of its last token, so the Continue that follows decodes nothing. A path that
        ends in a user message or a tool's result (one to answer again, or the parent of a
        reply being edited) gets the prompt for a reply to it, with those logits too, where
        replies keep their opening: the path alone would end on a chunk end that no later
        path has (PromptBuilder.marks).

        Done while the user reads or types, so that Send decodes only the new message. After
        a reply this re-decodes the reply in one batch (its one-token decode is not the
        canonical state; see Runtime.canonical_tokens). Returns None when the context holds
        exactly that already (for `scope`). Cancellable between chunks and inside one.
        """
        if not self.use_cache:
            return None  # every prompt is decoded from scratch anyway
        prompt = resume is None and bool(path) and path[-1].role in ANSWERED \
            and self.prompts.replies_keep_opening
        try:
            cut = self.fit(path, resume=resume, max_tokens=max_tokens, overflow=overflow,
                           tail=resume is not None or prompt, cancel=cancel)
        except ContextOverflowError:
            return None  # the real request will say it does not fit
        path = read_part(path, cut)
        if prompt:
            target, marks = self.prompts.target(path), self.prompts.target_marks(path)
        elif resume is None:
            target, marks = self.prompts.path_tokens(path), self.prompts.marks(path)
        else:
            target, marks, _ = self._continuation(path, resume)
        runtime = self.runtime
        if not target or len(target) >= runtime.n_ctx:
            return None  # nothing to warm, or the real request will say it does not fit
        held = runtime.live_tokens[: runtime.canonical_tokens]
        schedule = runtime.schedule(len(target), marks)
        if runtime.live_scope == scope and list(held) == target and schedule.agrees(
            runtime.live_bounds
        ) and ((resume is None and not prompt)
               or runtime.live_reuse(target, schedule) == len(target)):
            return None  # a reply also needs the last token's logits, kept
        report = self._prepare(list(path), target, marks, None, cancel, None, scope,
                               prompt_follows=prompt)
        runtime.flush_capture()  # no reply follows: keep the branch's checkpoint now
        return report

    def configure(self, *, sampling: SamplingParams, checkpoint_interval: int) -> None:
        self.sampling = sampling
        self.checkpoint_interval = checkpoint_interval

    def generate(
        self,
        *,
        max_tokens: int,
        seed: int,
        on_token: TokenFn | None = None,
        cancel: CancelFn | None = None,
        sampling: SamplingParams | None = None,
    ) -> Generation:
        """`sampling`: this reply's own (an API request's), else the configured one."""
        return self.runtime.generate(
            max_tokens=max_tokens, sampling=sampling or self.sampling, seed=seed,
            on_token=on_token,
            cancel=cancel,
        )

    def reply_tokens(
        self, path: Sequence[Node], generated: Sequence[int], text: str
    ) -> ReplyTokens:
        prompt = self.prompts.generation_prompt_text(path)  # rendered once for all uses
        opening = self.prompts.tokenize(prompt)
        tokens = self.prompts.reply_tokens(path, generated, text, opening=opening)
        read = [*opening, *generated]
        return ReplyTokens(
            tuple(tokens),
            len(read) if tokens[: len(read)] == read else None,
            len(opening) if tokens[: len(opening)] == opening else None,
            opens_reasoning(prompt),
        )

    def reasoning_closer(self, path: Sequence[Node]) -> str | None:
        """Where a reply to `path` starts inside its reasoning (the template ends the
        generation prompt with the opening marker: DeepSeek-R1's, Qwen3's thinking mode), the
        marker that ends it; else None."""
        return reasoning_closer(self.prompts.generation_prompt_text(path))

    def after_reply(self, yield_to: Callable[[], bool] | None = None) -> None:
        """After a request's last event, so that neither delays it: take the prompt-end
        checkpoint a dense cache or a hybrid's whole state defers past the reply
        (LiveState.waits_for_reply), then spill checkpoints over the budget, giving way to
        the next request once `yield_to()` (CheckpointStore.enforce_budget)."""
        self.runtime.flush_capture()
        if self.checkpoints is not None:
            self.checkpoints.enforce_budget(yield_to)

    def forget(self, node_ids: Iterable[int]) -> None:
        """Deleted nodes: free their checkpoints."""
        if self.checkpoints is not None:
            self.checkpoints.drop_nodes(node_ids)

    # --- internals -----------------------------------------------------------------------

    def _prepare(
        self,
        path: list[Node],
        target: list[int],
        marks: list[int],
        on_progress: ProgressFn | None,
        cancel: CancelFn | None,
        on_plan: PlanFn | None = None,
        scope: str = "",
        *,
        prompt_follows: bool = False,
    ) -> PrepareReport:
        """`prompt_follows`: the target is `path`, then the generation prompt."""
        runtime = self.runtime
        if not self.use_cache:
            runtime.clear()
            return runtime.prepare(
                target, marks=marks, use_live=False, on_progress=on_progress, on_plan=on_plan,
                cancel=cancel, scope=scope,
            )
        store = self.checkpoints
        if store is None:
            return runtime.prepare(
                target, marks=marks, on_progress=on_progress, on_plan=on_plan, cancel=cancel,
                scope=scope,
            )
        ends = list(itertools.accumulate(len(node.tokens or ()) for node in path))
        schedule = runtime.schedule(len(target), marks)
        store.protect(node.id for node in path)
        candidates = store.candidates(target, schedule, scope=scope)
        saved = {checkpoint.n_tokens for checkpoint in candidates}
        kind = runtime.memory_kind
        planned = plan_saves(kind, schedule, ends, self.checkpoint_interval,
                             prompt_covers_last=prompt_follows
                             and self.prompts.replies_keep_opening)
        # Where an attached document ends, on every kind: the question after it, an edit of
        # that question and a restart with the disk tier all restore it (engine.core.attachments).
        chunk_ends = set(schedule.ends)
        documents = {n for n in self.prompts.document_ends(path) if n in chunk_ends}
        planned = sorted({*planned, *documents})
        partial = runtime.partial_states
        room = _inner_room(store, partial=partial)
        inner = set(plan_inner(kind, schedule, marks, runtime.grid,
                               most=min(INNER_MOST, room))[-room:] if room else ())
        inner -= set(planned)
        # A candidate of that length holds exactly that state.
        saves = [n for n in sorted({*planned, *inner}) if n not in saved]
        # Where a partial state serves (`Runtime.partial_states`): inside messages and at
        # their ends, which edits and the next turns restore while the live cache still
        # holds the branch. The prompt's end and the interval's states stay whole: they are
        # what a swipe or a return to another branch restores, after the live cache moved.
        # Where a partial state is cheap (a hybrid), the prompt's end gets a partial twin
        # too: what a swipe restores while the live cache still holds the prompt.
        crossings = set(crossing(schedule, 0, self.checkpoint_interval))
        # A document's end stays whole too: it serves every later question on the document,
        # after a restart as well (a partial state never goes to the disk tier).
        partial_at = {n for n in saves if n < len(target) and n not in crossings
                      and n not in documents} if partial else set()

        def keep(checkpoint: Checkpoint) -> None:
            # Attach it to the node holding its last token; the prompt's end (the reply's
            # generation prompt) belongs to the last message of the path. It carries this
            # scope: the runtime captured it from state prepared for the scope.
            index = bisect.bisect_left(ends, checkpoint.n_tokens)
            node = path[min(index, len(path) - 1)]
            store.add(replace(checkpoint, node_id=node.id),
                      inner=checkpoint.n_tokens in inner)

        prepared = runtime.prepare(
            target,
            marks=marks,
            checkpoints=candidates,
            fetch=store.fetch,
            save_at=saves,
            partial_at=partial_at,
            twin_end=runtime.cheap_partials,
            on_checkpoint=keep,
            on_progress=on_progress,
            on_plan=on_plan,
            cancel=cancel,
            scope=scope,
        )
        for checkpoint_id in prepared.failed_checkpoints:
            store.reject(checkpoint_id)
        if prepared.checkpoint_id is not None:
            store.mark_restored(prepared.checkpoint_id)
        return prepared


def _inner_room(store: CheckpointStore, *, partial: bool = False) -> int:
    """How many inner checkpoints (`plan_inner`) one prepare may take: as many as the RAM
    the other checkpoints leave would hold at the size of the largest one kept (the estimate
    of the next one's: a state stays the same size or grows with its position); with none
    kept yet, INNER_MOST. Those of the last messages are kept (users edit recent ones). The
    store drops inner checkpoints over the budget whatever the estimate said. `partial`: the
    inner ones will be partial states, sized by the largest such one kept."""
    size = store.largest(partial=partial)
    return INNER_MOST if size == 0 else store.inner_room() // size
