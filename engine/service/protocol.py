"""What a front end says to the engine, and what the engine says back: immutable values.

The engine service (`engine.service.handler`) takes one request at a time and answers with events.
The same values serve the engine on a thread of the window's process and the engine in a
process of its own, so every field is plain data (no callables, no open files) and this module
loads no native library. A node is named by `(conversation, node)`: a request carries its
conversation's id and its nodes' own ids, and the engine keys checkpoints by both (`node_key`,
the one place they are packed), so checkpoints of different conversations never collide and
every front end's (the window's, its local API's) are shown, freed and exported with their
conversation.
A request's `scope` says whose it is ("" the window's; the API gives each `user` one): the
engine reuses cached state only within a scope (engine.storage.checkpoints).

Stop and pre-emption do not queue behind a running request: they go through the `Control`
the service was built with (flags and a counter the engine checks between chunks, inside a
chunk and between tokens).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from engine.config.params import CheckpointOptions, RuntimeSettings, SamplingParams
from engine.config.settings import Settings
from engine.core.overflow import Overflow
from engine.core.records import ConversationRecord
from engine.core.results import NodeView, Outcome, ReplyReport, Reuse
from engine.models.fit import GpuMemory
from engine.storage.checkpoints import Checkpoint, Identity

# --- node identity ---------------------------------------------------------------------------

NODE_BITS = 32  # a conversation's node ids stay below 2**32


def node_key(conversation_id: int, node_id: int) -> int:
    """The engine's key for a node: its checkpoints'. Never crosses the boundary."""
    return (conversation_id << NODE_BITS) | node_id


def node_of_key(key: int) -> tuple[int, int]:
    """(conversation, node) of a `node_key`."""
    return key >> NODE_BITS, key & ((1 << NODE_BITS) - 1)


# --- requests --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineOptions:
    """A load as the command line asks for it (the app's loads come from its `Settings`)."""

    runtime: RuntimeSettings
    sampling: SamplingParams
    checkpoints: CheckpointOptions
    use_cache: bool = True  # False: every prompt decoded whole (the reference)
    template: str | None = None  # a chat template by name; None: automatic


@dataclass(frozen=True)
class LoadRequest:
    path: str
    settings: Settings = field(default_factory=Settings)
    options: EngineOptions | None = None  # given: these, not `settings`
    # The window's loads: an RPC worker that does not answer is left out (and the notice
    # names it) instead of failing the load; the command line refuses instead.
    without_unreachable_workers: bool = False


@dataclass(frozen=True)
class ConfigureRequest:
    """New settings: applied at once, or by loading the model again when the context has to
    change (the front end has told the user what that costs)."""

    settings: Settings


@dataclass(frozen=True)
class WarmRequest:
    """Prepare `path` (ending with a complete message) while nothing else runs; with
    `resume`, the prompt that continues that unfinished reply to path[-1] (as a
    GenerateRequest with that `resume` would prepare it).

    `epoch` is the engine's real-request count when this was sent: any real request sent
    since makes it stale, and a stale warm-up stops at once (within a chunk)."""

    epoch: int
    conversation_id: int
    path: tuple[NodeView, ...]
    max_tokens: int = 512  # with `overflow`: which part of the path a reply would read
    overflow: Overflow = Overflow.STOP
    scope: str = ""  # whose state it prepares: "" the window's
    resume: NodeView | None = None  # the reply a Continue would go on with


@dataclass(frozen=True)
class GenerateRequest:
    request_id: int
    conversation_id: int
    reply_id: int  # the reply node the front end created (or the one being continued)
    path: tuple[NodeView, ...]  # root .. the message being answered
    resume: NodeView | None  # continue this reply instead of starting a new one
    max_tokens: int
    seed: int
    sampling: SamplingParams | None = None  # this reply's own (API requests); else configured
    overflow: Overflow = Overflow.STOP  # when the path outgrows the context (engine.core.overflow)
    scope: str = ""  # whose request: only this scope's cached state is reused ("" the window)


@dataclass(frozen=True)
class ExportRequest:
    """Write a session file with the conversation and the engine's checkpoints for it."""

    path: str
    conversation_id: int
    records: tuple[ConversationRecord, ...]


@dataclass(frozen=True)
class AdoptCheckpoints:
    """Checkpoints read from an imported session file (verified against `identity`): the
    window's (scope "")."""

    identity: Identity
    checkpoints: tuple[Checkpoint, ...]


@dataclass(frozen=True)
class ForgetRequest:
    """Deleted branches of a conversation: free their checkpoints."""

    conversation_id: int
    node_ids: tuple[int, ...]


@dataclass(frozen=True)
class Sync:
    """Answered with `Synced(token)` once every request before it is done: every event
    they caused has been sent."""

    token: int


Request = (LoadRequest | ConfigureRequest | WarmRequest | GenerateRequest | ExportRequest
           | AdoptCheckpoints | ForgetRequest | Sync)

# --- control: acted on at once by an engine in its own process, never queued ----------------


@dataclass(frozen=True)
class Stop:
    """Stop a reply (within a chunk or a token): the one of `request_id`, running or still
    queued, or with None whatever runs. Two front ends share the app's engine (the window
    and its local API): each stops its own reply only."""

    request_id: int | None = None


@dataclass(frozen=True)
class Preempt:
    """Real requests sent so far: a warm-up of an older epoch is stale."""

    epoch: int


@dataclass(frozen=True)
class Shutdown:
    """Finish nothing more; free the model and exit."""


class CrashKind(StrEnum):
    ABORT = "abort"  # abort(): what llama.cpp does on GGML_ASSERT or an RPC failure
    KILL = "kill"  # SIGKILL, as the out-of-memory killer does


@dataclass(frozen=True)
class Crash:
    """A fault injected by the tests: the engine process dies at once, however busy."""

    kind: CrashKind = CrashKind.ABORT


Control = Stop | Preempt | Shutdown | Crash

# --- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineStarted:
    """An engine process is up (sent first, before any request is taken)."""

    pid: int
    builtin_templates: tuple[str, ...]  # the chat templates llama.cpp knows by name
    gpu: GpuMemory | None = None  # this machine's GPUs' memory, as it starts; None: no GPU


# The engine process's exit status when a message from the front end cannot be read (a
# front end and an engine of different versions, or a bug): it ends rather than go deaf.
EXIT_UNREADABLE = 3


@dataclass(frozen=True)
class Alive:
    """The engine process's heartbeat, sent every `engine.service.process.HEARTBEAT_S` whatever it
    is
    doing; it never leaves `engine.service.process` (a silent engine is declared dead there)."""


@dataclass(frozen=True)
class EngineDied:
    """The engine process ended without being asked to (sent by the front end's client)."""

    exitcode: int | None  # negative: killed by that signal
    # Set when it faulted loading a model or decoding its first prompt: it loads that model
    # without weight repacking from now on (engine.llm.repack), in words.
    kernels_fallback: str | None = None
    # Set when it went silent (no event, not even a heartbeat, for that long) and was killed.
    silent_s: float | None = None

    def describe(self) -> str:
        if self.kernels_fallback is not None:
            return self.kernels_fallback
        if self.silent_s is not None:
            return f"it stopped answering (no sign of life for {self.silent_s:.0f} s)"
        code = self.exitcode
        if code is None:
            return "it stopped answering"
        if code == EXIT_UNREADABLE:
            return "it could not read a message from the app"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return {"SIGABRT": "llama.cpp aborted", "SIGKILL": "it was killed (out of memory?)",
                    "SIGSEGV": "it crashed"}.get(name, f"it ended on {name}")
        return f"it exited with status {code}"


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
    template_name: str = ""  # its name
    details: tuple[tuple[str, object], ...] = ()  # Runtime.report(): the replay report's model
    gpu: GpuMemory | None = None  # the GPUs' memory with this model loaded; None: no GPU
    tool_format: str = ""  # how its chat template writes tool calls (a ToolFormat's name; "")


@dataclass(frozen=True)
class LoadFailed:
    path: str
    message: str  # the previous model, if any, keeps working


@dataclass(frozen=True)
class TemplateChanged:
    description: str  # the chat template for new messages, in words
    tool_format: str = ""  # how it writes tool calls (as ModelLoaded.tool_format)


@dataclass(frozen=True)
class Warmed:
    conversation_id: int
    last_node: int  # the path's last node
    prompt_tokens: int  # what the context holds now
    report: ReplyReport | None  # None: the context held it already (or it did not run)
    rendered: tuple[tuple[int, tuple[int, ...]], ...] = ()  # tokens path nodes keep
    done: bool = True  # False: pre-empted or failed (a warm-up is only an optimisation)


@dataclass(frozen=True)
class Progress:
    """A reply's prompt being decoded: what it reuses and from where (fixed before the first
    token is decoded, `done` 0), and how far it has got."""

    request_id: int
    reuse: Reuse
    done: int
    total: int  # tokens to decode


@dataclass(frozen=True)
class Piece:
    request_id: int
    conversation_id: int
    reply_id: int
    text: str
    reasoning_opened: bool = False  # the reply started inside its reasoning (run_reply)


@dataclass(frozen=True)
class Finished:
    """A reply's last event: how it ended (`engine.core.results.Outcome`). Everything the
    request caused (the checkpoint figures it changed included) was sent before it."""

    request_id: int
    conversation_id: int
    reply_id: int
    outcome: Outcome


@dataclass(frozen=True)
class CheckpointUsage:
    """What the checkpoint store holds: counts, bytes, the nodes that have one, its figures."""

    count: int
    ram_bytes: int
    disk_bytes: int
    ram_budget: int
    nodes: tuple[tuple[int, int, str], ...]  # (conversation, node, "ram" | "disk")
    stats: tuple[tuple[str, object], ...] = ()  # CheckpointStore.stats(), every figure


@dataclass(frozen=True)
class ExportDone:
    path: str
    checkpoints: int
    error: str | None  # None: written


@dataclass(frozen=True)
class Synced:
    token: int


Event = (EngineStarted | EngineDied | LoadProgress | ModelLoaded | LoadFailed | TemplateChanged
         | Warmed | Progress | Piece | Finished | CheckpointUsage | ExportDone | Synced)
Emit = Callable[[Event], None]  # where an engine sends its events

__all__ = [
    "AdoptCheckpoints",
    "Alive",
    "CheckpointUsage",
    "ConfigureRequest",
    "EngineOptions",
    "Event",
    "ExportDone",
    "ExportRequest",
    "Finished",
    "ForgetRequest",
    "GenerateRequest",
    "LoadFailed",
    "LoadProgress",
    "LoadRequest",
    "ModelLoaded",
    "NodeView",
    "Piece",
    "Progress",
    "Request",
    "Sync",
    "Synced",
    "TemplateChanged",
    "WarmRequest",
    "Warmed",
]
