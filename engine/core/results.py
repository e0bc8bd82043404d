"""What one reply came to, as plain values: where its prompt came from, how it finished, its
tokens and figures. They cross the process boundary and are read where no model is loaded;
running a reply is `engine.llm.reply`'s business, applying its result to a tree the conversation's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import StrEnum

from engine.core.attachments import DOCUMENTS
from engine.core.errors import (
    ArborError,
    ContextOverflowError,
    EngineCrashed,
    KernelsCrashed,
    UnsupportedRequest,
)
from engine.core.tools import TOOL_META
from engine.core.tree import Node, Role

LEFT_OUT = "left_out"  # reply meta: how many of the oldest messages it did not read
ENGINE_META = (*TOOL_META, DOCUMENTS)  # the meta keys the engine reads of a node


class Source(StrEnum):
    """Where the state a prompt was prepared from came from."""

    LIVE = "live"  # the live cache held a usable prefix
    CHECKPOINT = "checkpoint"  # a saved state was restored
    NONE = "none"  # decoded from scratch


class FinishReason(StrEnum):
    STOP = "stop"  # the model produced an end-of-generation token
    LENGTH = "length"  # max_tokens reached
    CONTEXT_FULL = "context_full"  # no room left in the context
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Reuse:
    """What a prepare reuses and from where, fixed before it decodes anything: what a
    progress bar says (a reply's `ReplyReport` says it again with the figures)."""

    prompt_tokens: int
    reused_tokens: int
    source: Source
    checkpoint_pos: int | None  # the restored checkpoint's last position

    def describe(self) -> str:
        """What the prepare reuses, for a person watching it decode."""
        if self.source is Source.NONE:
            return f"Reading the conversation from the start: {self.prompt_tokens:,} tokens"
        where = "restored checkpoint" if self.source is Source.CHECKPOINT else "kept the cache"
        return (f"{where} at {self.reused_tokens:,} of {self.prompt_tokens:,} tokens, "
                f"decoding {self.prompt_tokens - self.reused_tokens:,}")


@dataclass(frozen=True)
class NodeView:
    """What the engine needs of a node: never the node itself (its owner keeps that)."""

    id: int
    role: Role
    text: str
    tokens: tuple[int, ...] | None
    open_len: int | None = None
    prompt_len: int | None = None  # where the reply's generation prompt ends
    meta: str | None = None  # JSON of the meta the engine reads (ENGINE_META), if any

    @staticmethod
    def of(node: Node, *, id: int | None = None) -> NodeView:
        open_len, prompt_len = node.meta.get("open_len"), node.meta.get("prompt_len")
        read = {k: node.meta[k] for k in ENGINE_META if k in node.meta}
        return NodeView(node.id if id is None else id, node.role, node.text, node.tokens,
                        open_len if isinstance(open_len, int) else None,
                        prompt_len if isinstance(prompt_len, int) else None,
                        json.dumps(read) if read else None)

    def to_node(self, id: int | None = None) -> Node:
        """A private, mutable copy for the engine (under `id`, if given)."""
        meta: dict[str, object] = {}
        if self.open_len is not None:
            meta["open_len"] = self.open_len
        if self.prompt_len is not None:
            meta["prompt_len"] = self.prompt_len
        if self.meta is not None:
            meta.update(json.loads(self.meta))
        return Node(id=self.id if id is None else id, parent=None, role=self.role,
                    text=self.text, created=0.0,
                    tokens=self.tokens, meta=meta)


# What a prepare and a reply report while they run, one callback type each.
CancelFn = Callable[[], bool]  # True: stop as soon as possible (raises Cancelled)
PlanFn = Callable[[Reuse], None]  # the plan, fixed before anything is decoded
ProgressFn = Callable[[int, int], None]  # (tokens decoded so far, tokens to decode)
TokenFn = Callable[[int, str], None]  # (token id, text it added)
PieceFn = Callable[[str], None]  # the text one generated token added
OpenedFn = Callable[[], None]  # the reply starts inside its reasoning (engine.core.reasoning)


@dataclass(frozen=True)
class Prepared:
    """What a prepare did: what it reused and from where, what it decoded, how long it took.
    `Reuse` is the part of it fixed before anything is decoded."""

    prompt_tokens: int
    reused_tokens: int
    decoded_tokens: int
    source: Source
    checkpoint_pos: int | None
    prefill_ms: float

    @property
    def reuse(self) -> Reuse:
        return Reuse(self.prompt_tokens, self.reused_tokens, self.source, self.checkpoint_pos)


@dataclass(frozen=True)
class ReplyReport(Prepared):
    """What the engine did for one step: the prepare's figures and the reply's.

    The replay report's step figures and the window's status line both read this. A warm-up
    (a prepare with no reply) has no generation: `finish` is None and the counts are 0."""

    ttft_ms: float | None = None  # from the start of the prepare to the first token
    generated_tokens: int = 0
    decode_ms: float = 0.0
    finish: FinishReason | None = None
    dropped: int = 0  # messages left out of the prompt (engine.core.overflow)

    @staticmethod
    def of_prepare(prepared: Prepared) -> ReplyReport:
        """The figures of a prepare alone (a warm-up); a reply adds its generation."""
        return ReplyReport(**{field.name: getattr(prepared, field.name)
                              for field in fields(Prepared)})

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
class TokenLogprob:
    """A generated token's log-probability under the model (the log-softmax of its logits,
    before any sampler), with the likeliest tokens at that step (OpenAI's `logprobs`)."""

    text: str
    data: bytes  # the token's bytes (a piece of a UTF-8 character is not text on its own)
    logprob: float
    top: tuple[tuple[str, bytes, float], ...] = ()

    def body(self) -> dict[str, object]:
        return {"token": self.text, "logprob": self.logprob, "bytes": list(self.data),
                "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(b)}
                                 for t, b, lp in self.top]}


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
    logprobs: tuple[TokenLogprob, ...] = ()  # of the generated tokens, when asked for

    @property
    def finish(self) -> FinishReason:
        assert self.report.finish is not None
        return self.report.finish


@dataclass(frozen=True)
class Stopped:
    """A reply stopped before it said anything (by its front end, or pre-empted). One
    stopped after it said something is a `ReplyResult` finished as `FinishReason.CANCELLED`:
    what it said is kept."""

    rendered: Rendered = ()  # path nodes rendered before the stop: they keep these tokens


class FailureKind(StrEnum):
    ERROR = "error"  # a user-facing error (engine.core.errors)
    UNSUPPORTED = "unsupported"  # the request asks what the model cannot do: nothing changed
    OVERFLOW = "overflow"  # the prompt did not fit the context
    INTERNAL = "internal"  # a bug in the engine; logged there
    ENGINE_DIED = "engine_died"  # the engine process ended under the reply
    KERNELS = "kernels"  # it ended loading or on its first prompt: worth one more try
    PREEMPTED = "preempted"  # the engine's owner (the app's user) took it for their reply


@dataclass(frozen=True)
class ReplyFailure:
    """Why a reply failed, as a value that crosses the process boundary."""

    kind: FailureKind
    message: str
    overflow: tuple[int, int] | None = None  # OVERFLOW: (the prompt's tokens, n_ctx)
    rendered: Rendered = ()  # path nodes rendered before the failure: they keep these tokens

    def error(self) -> ArborError:
        """The exception a blocking caller raises for it."""
        match self.kind:
            case FailureKind.OVERFLOW if self.overflow is not None:
                return ContextOverflowError(*self.overflow)
            case FailureKind.ENGINE_DIED:
                return EngineCrashed(self.message)
            case FailureKind.KERNELS:
                return KernelsCrashed(self.message)
            case FailureKind.UNSUPPORTED:
                return UnsupportedRequest(self.message)
        return ArborError(self.message)


# How a reply ended: what it said (finished, or stopped after saying something), a stop
# before it said anything, or a typed failure.
Outcome = ReplyResult | Stopped | ReplyFailure
