"""One reply, start to finish: prepare the prompt, generate, finish the reply's tokens.

Every front end runs a reply through `run_reply`: `Session` on its own thread (the command
line, the tests), the engine service on the engine's thread or process (the window). It reads
a path of nodes and returns plain values (`ReplyResult`, with its `ReplyReport`); applying them
to a tree is the conversation core's business (`Conversation.finish_reply`).

This module loads no native library: the generator is only named in annotations, so the value
types can cross a process boundary and be read where no model is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from engine.overflow import Overflow, read_part
from engine.params import FinishReason, SamplingParams, Source
from engine.tree import Node, Role

if TYPE_CHECKING:
    from engine.generator import Generator
    from engine.runtime import PrepareReport

LEFT_OUT = "left_out"  # reply meta: how many of the oldest messages it did not read

CancelFn = Callable[[], bool]
ProgressFn = Callable[[int, int], None]  # (tokens decoded so far, tokens to decode)
PlanFn = Callable[[int, int, Source, int | None], None]  # see engine.runtime.PlanFn
PieceFn = Callable[[str], None]  # the text one generated token added
OpenedFn = Callable[[], None]  # the reply starts inside its reasoning (engine.reasoning)


@dataclass(frozen=True)
class NodeView:
    """What the engine needs of a node: never the node itself (its owner keeps that)."""

    id: int
    role: Role
    text: str
    tokens: tuple[int, ...] | None
    open_len: int | None = None
    prompt_len: int | None = None  # where the reply's generation prompt ends

    @staticmethod
    def of(node: Node, *, id: int | None = None) -> NodeView:
        open_len, prompt_len = node.meta.get("open_len"), node.meta.get("prompt_len")
        return NodeView(node.id if id is None else id, node.role, node.text, node.tokens,
                        open_len if isinstance(open_len, int) else None,
                        prompt_len if isinstance(prompt_len, int) else None)

    def to_node(self) -> Node:
        """A private, mutable copy for the engine."""
        meta: dict[str, object] = {}
        if self.open_len is not None:
            meta["open_len"] = self.open_len
        if self.prompt_len is not None:
            meta["prompt_len"] = self.prompt_len
        return Node(id=self.id, parent=None, role=self.role, text=self.text, created=0.0,
                    tokens=self.tokens, meta=meta)


@dataclass(frozen=True)
class ReplyReport:
    """What the engine did for one step: what it reused, what it decoded, how long it took.

    The replay report's step figures and the window's status line both read this. A warm-up
    (a prepare with no reply) has no generation: `finish` is None and the counts are 0."""

    prompt_tokens: int
    reused_tokens: int
    decoded_tokens: int
    source: Source
    checkpoint_pos: int | None
    prefill_ms: float
    ttft_ms: float | None = None  # from the start of the prepare to the first token
    generated_tokens: int = 0
    decode_ms: float = 0.0
    finish: FinishReason | None = None
    dropped: int = 0  # messages left out of the prompt (engine.overflow)

    @staticmethod
    def of_prepare(prepared: PrepareReport) -> ReplyReport:
        """The figures of a prepare alone (a warm-up); a reply adds its generation."""
        return ReplyReport(
            prompt_tokens=prepared.prompt_tokens, reused_tokens=prepared.reused_tokens,
            decoded_tokens=prepared.decoded_tokens, source=prepared.source,
            checkpoint_pos=prepared.checkpoint_pos, prefill_ms=prepared.prefill_ms)

    def describe(self) -> str:
        """One line for a person: where the prompt came from and how fast it went."""
        source = {Source.LIVE: "reused the live cache",
                  Source.CHECKPOINT: f"restored checkpoint at {self.checkpoint_pos}",
                  Source.NONE: "read from scratch"}[self.source]
        line = (f"{source}: {self.reused_tokens:,} of {self.prompt_tokens:,} tokens reused, "
                f"{self.decoded_tokens:,} decoded in {self.prefill_ms / 1000:.2f} s")
        if self.dropped:
            line += (f"; {self.dropped} earlier message{'s' * (self.dropped != 1)} "
                     f"outside the context")
        if self.finish is None:
            return line
        rate = self.generated_tokens / max(self.decode_ms / 1000, 1e-3)
        return (f"{line}; first token after {(self.ttft_ms or 0) / 1000:.2f} s; "
                f"{self.generated_tokens} tokens at {rate:.1f}/s")


# (node id, tokens) for path nodes that had no tokens and were rendered now: they keep them.
Rendered = tuple[tuple[int, tuple[int, ...]], ...]


@dataclass(frozen=True)
class ReplyResult:
    """A finished (or stopped) reply, as plain values."""

    text: str  # the whole reply, a continued reply's earlier text included
    # Generation prompt + generated tokens + the template's closing; or, under a template
    # that renders the reply otherwise in later turns (Qwen3's drops its reasoning), that
    # later rendering (see PromptBuilder.reply_tokens).
    tokens: tuple[int, ...]
    meta: tuple[tuple[str, object], ...]  # what the reply node keeps (ReplyTokens.meta)
    rendered: Rendered
    report: ReplyReport

    @property
    def finish(self) -> FinishReason:
        assert self.report.finish is not None
        return self.report.finish


def rendered(path: Sequence[Node], untokenized: set[int]) -> Rendered:
    """The tokens a prepare gave path nodes that had none (ids from `untokenized`)."""
    return tuple((node.id, node.tokens) for node in path
                 if node.id in untokenized and node.tokens is not None)


def run_reply(
    generator: Generator,
    path: Sequence[Node],
    *,
    resume: Node | None = None,
    max_tokens: int,
    seed: int,
    on_plan: PlanFn | None = None,
    on_progress: ProgressFn | None = None,
    on_piece: PieceFn | None = None,
    on_opened: OpenedFn | None = None,
    cancel: CancelFn | None = None,
    sampling: SamplingParams | None = None,
    overflow: Overflow = Overflow.STOP,
    scope: str = "",
) -> ReplyResult:
    """Answer the last node of `path` (or go on with `resume`, a reply to it).

    Under `Overflow.DROP_OLDEST` a path too long for the context is read without its oldest
    messages (`engine.overflow`); the reply's meta says how many it left out (`LEFT_OUT`).
    The generation prompt is rendered once, for the reply's tokens. A stop during the
    prepare raises `Cancelled` (nothing was said); a stop during generation returns what was
    said so far, finished as `FinishReason.CANCELLED`. Other errors propagate. Call
    `generator.after_reply()` once the result is delivered (it may spill checkpoints).
    `on_opened` is called before the first piece when the generation prompt opened the
    reply's reasoning, so a front end shows the streaming text as reasoning from the start
    (the finished reply's meta says so too: `engine.reasoning.OPENED`).
    `scope`: whose request it is; only that scope's cached state is reused.
    """
    untokenized = {node.id for node in path if node.tokens is None}
    cut = generator.fit(path, resume=resume, max_tokens=max_tokens, overflow=overflow,
                        cancel=cancel)
    read = read_part(path, cut)
    prepared = generator.prepare(read, resume=resume, on_progress=on_progress,
                                 on_plan=on_plan, cancel=cancel, scope=scope)
    if on_opened is not None and generator.opens_reasoning(read):
        on_opened()
    generation = generator.generate(
        max_tokens=max_tokens, seed=seed, cancel=cancel, sampling=sampling,
        on_token=(lambda _token, piece: on_piece(piece)) if on_piece is not None else None,
    )
    text = prepared.base_text + generation.text
    finished = generator.reply_tokens(read, [*prepared.before, *generation.tokens], text)
    prep = prepared.report
    ttft = prep.prefill_ms + generation.ttft_ms if generation.ttft_ms is not None else None
    report = replace(ReplyReport.of_prepare(prep), ttft_ms=ttft,
                     generated_tokens=len(generation.tokens), decode_ms=generation.decode_ms,
                     finish=generation.finish, dropped=cut.dropped)
    meta = finished.meta()
    if cut.dropped:
        meta[LEFT_OUT] = cut.dropped  # a count, not ids: imports renumber nodes
    return ReplyResult(text, finished.tokens, tuple(meta.items()),
                       rendered(path, untokenized), report)
