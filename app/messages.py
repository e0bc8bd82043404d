"""The immutable values that cross between the GUI thread and the engine thread."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.checkpoints import Checkpoint, Identity
from engine.records import ConversationRecord
from engine.settings import Settings
from engine.tree import Node, Role


@dataclass(frozen=True)
class NodeView:
    """What the engine needs of a node: never the node itself (the GUI thread owns it)."""

    id: int
    role: Role
    text: str
    tokens: tuple[int, ...] | None
    open_len: int | None = None
    prompt_len: int | None = None  # where the reply's generation prompt ends

    @staticmethod
    def of(node: Node) -> NodeView:
        open_len, prompt_len = node.meta.get("open_len"), node.meta.get("prompt_len")
        return NodeView(node.id, node.role, node.text, node.tokens,
                        open_len if isinstance(open_len, int) else None,
                        prompt_len if isinstance(prompt_len, int) else None)

    def to_node(self) -> Node:
        """A private, mutable copy for the engine thread."""
        meta: dict[str, object] = {}
        if self.open_len is not None:
            meta["open_len"] = self.open_len
        if self.prompt_len is not None:
            meta["prompt_len"] = self.prompt_len
        return Node(id=self.id, parent=None, role=self.role, text=self.text, created=0.0,
                    tokens=self.tokens, meta=meta)


@dataclass(frozen=True)
class LoadRequest:
    path: str
    settings: Settings = field(default_factory=Settings)


@dataclass(frozen=True)
class LoadProgress:
    path: str
    fraction: float  # 0..1, from llama.cpp's loader


@dataclass(frozen=True)
class WarmRequest:
    """Prepare `path` (ending with a complete message) while nothing else runs.

    `epoch` is the worker's real-request count when this was sent: any real request sent
    since makes it stale, and a stale warm-up stops at once (within a chunk)."""

    epoch: int
    conversation_id: int
    path: tuple[NodeView, ...]


@dataclass(frozen=True)
class Warmed:
    conversation_id: int
    last_node: int  # global id of the path's last node
    prompt_tokens: int
    decoded_tokens: int  # 0: the context held it already
    prefill_ms: float
    # Tokens rendered for path nodes that had none: they keep them (global id, tokens).
    node_tokens: tuple[tuple[int, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class Plan:
    """What a prepare will reuse, sent before it decodes anything."""

    request_id: int
    prompt_tokens: int
    reused_tokens: int
    source: str  # "live" | "checkpoint" | "none"
    checkpoint_pos: int | None


@dataclass(frozen=True)
class GenerateRequest:
    request_id: int
    conversation_id: int
    reply_id: int  # the reply node the GUI created (or the one being continued)
    path: tuple[NodeView, ...]  # root .. the message being answered
    resume: NodeView | None  # continue this reply instead of starting a new one
    max_tokens: int
    seed: int


@dataclass(frozen=True)
class ModelLoaded:
    name: str
    path: str
    architecture: str
    memory_kind: str
    backend: str
    n_ctx: int
    notices: tuple[str, ...]
    identity: Identity | None = None  # what a checkpoint must match to load in this context
    template: str = ""  # which chat template renders new messages, in words


@dataclass(frozen=True)
class Progress:
    request_id: int
    done: int
    total: int


@dataclass(frozen=True)
class Piece:
    request_id: int
    conversation_id: int
    reply_id: int
    text: str


@dataclass(frozen=True)
class ReplyDone:
    request_id: int
    conversation_id: int
    reply_id: int
    node_tokens: tuple[tuple[int, tuple[int, ...]], ...]  # tokens rendered for path nodes
    text: str
    tokens: tuple[int, ...]
    meta: tuple[tuple[str, object], ...]  # what the reply node keeps (ReplyTokens.meta)
    finish: str
    prompt_tokens: int
    reused_tokens: int
    decoded_tokens: int
    source: str
    checkpoint_pos: int | None
    prefill_ms: float
    ttft_ms: float | None
    generated_tokens: int
    decode_ms: float


@dataclass(frozen=True)
class Failed:
    request_id: int
    conversation_id: int
    reply_id: int
    message: str  # empty when the user stopped it (`aborted`), else why it failed


@dataclass(frozen=True)
class StoreUsage:
    count: int
    ram_bytes: int
    disk_bytes: int
    ram_budget: int
    nodes: tuple[tuple[int, str], ...]  # node id -> "ram" | "disk"


@dataclass(frozen=True)
class ExportRequest:
    """Write a session file with the conversation and the engine's checkpoints for it."""

    path: str
    conversation_id: int
    records: tuple[ConversationRecord, ...]


@dataclass(frozen=True)
class ExportDone:
    path: str
    checkpoints: int
    error: str | None  # None: written


@dataclass(frozen=True)
class AdoptCheckpoints:
    """Checkpoints read from an imported session file (verified against `identity`)."""

    identity: Identity
    checkpoints: tuple[Checkpoint, ...]
