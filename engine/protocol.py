"""What a front end says to the engine, and what the engine says back: immutable values.

The engine service (`engine.service`) takes one request at a time and answers with events.
The same values serve the engine on a thread of the window's process and the engine in a
process of its own, so every field is plain data (no callables, no open files) and this module
loads no native library. Node ids are the front end's: the window sends global ids
(conversation << 32 | node) so that checkpoints of different conversations never collide.

Stop and pre-emption do not queue behind a running request: they go through the `Control`
the service was built with (a flag and a counter the engine checks between chunks, inside a
chunk and between tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.checkpoints import Checkpoint, Identity
from engine.records import ConversationRecord
from engine.reply import NodeView, ReplyReport, ReplyResult
from engine.settings import Settings

# --- requests --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadRequest:
    path: str
    settings: Settings = field(default_factory=Settings)


@dataclass(frozen=True)
class ConfigureRequest:
    """New settings: applied at once, or by loading the model again when the context has to
    change (the front end has told the user what that costs)."""

    settings: Settings


@dataclass(frozen=True)
class WarmRequest:
    """Prepare `path` (ending with a complete message) while nothing else runs.

    `epoch` is the engine's real-request count when this was sent: any real request sent
    since makes it stale, and a stale warm-up stops at once (within a chunk)."""

    epoch: int
    conversation_id: int
    path: tuple[NodeView, ...]


@dataclass(frozen=True)
class GenerateRequest:
    request_id: int
    conversation_id: int
    reply_id: int  # the reply node the front end created (or the one being continued)
    path: tuple[NodeView, ...]  # root .. the message being answered
    resume: NodeView | None  # continue this reply instead of starting a new one
    max_tokens: int
    seed: int


@dataclass(frozen=True)
class ExportRequest:
    """Write a session file with the conversation and the engine's checkpoints for it."""

    path: str
    conversation_id: int
    records: tuple[ConversationRecord, ...]


@dataclass(frozen=True)
class AdoptCheckpoints:
    """Checkpoints read from an imported session file (verified against `identity`)."""

    identity: Identity
    checkpoints: tuple[Checkpoint, ...]


@dataclass(frozen=True)
class ForgetRequest:
    """Deleted branches: free their checkpoints."""

    node_ids: tuple[int, ...]


Request = (LoadRequest | ConfigureRequest | WarmRequest | GenerateRequest | ExportRequest
           | AdoptCheckpoints | ForgetRequest)

# --- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadProgress:
    path: str
    fraction: float  # 0..1, from llama.cpp's loader


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
class LoadFailed:
    path: str
    message: str  # the previous model, if any, keeps working


@dataclass(frozen=True)
class TemplateChanged:
    description: str  # the chat template for new messages, in words


@dataclass(frozen=True)
class Warmed:
    conversation_id: int
    last_node: int  # the path's last node
    prompt_tokens: int  # what the context holds now
    report: ReplyReport | None  # None: the context held it already
    rendered: tuple[tuple[int, tuple[int, ...]], ...] = ()  # tokens path nodes keep


@dataclass(frozen=True)
class Plan:
    """What a prepare will reuse, sent before it decodes anything."""

    request_id: int
    prompt_tokens: int
    reused_tokens: int
    source: str  # "live" | "checkpoint" | "none"
    checkpoint_pos: int | None


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
    result: ReplyResult


@dataclass(frozen=True)
class Failed:
    request_id: int
    conversation_id: int
    reply_id: int
    message: str  # empty when the user stopped it, else why it failed


@dataclass(frozen=True)
class StoreUsage:
    count: int
    ram_bytes: int
    disk_bytes: int
    ram_budget: int
    nodes: tuple[tuple[int, str], ...]  # node id -> "ram" | "disk"


@dataclass(frozen=True)
class ExportDone:
    path: str
    checkpoints: int
    error: str | None  # None: written


Event = (LoadProgress | ModelLoaded | LoadFailed | TemplateChanged | Warmed | Plan | Progress
         | Piece | ReplyDone | Failed | StoreUsage | ExportDone)

__all__ = [
    "AdoptCheckpoints",
    "ConfigureRequest",
    "Event",
    "ExportDone",
    "ExportRequest",
    "Failed",
    "ForgetRequest",
    "GenerateRequest",
    "LoadFailed",
    "LoadProgress",
    "LoadRequest",
    "ModelLoaded",
    "NodeView",
    "Piece",
    "Plan",
    "Progress",
    "ReplyDone",
    "Request",
    "StoreUsage",
    "TemplateChanged",
    "WarmRequest",
    "Warmed",
]
