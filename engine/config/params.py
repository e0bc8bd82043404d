"""The plain values that configure a context and sampling: readable without llama.cpp.

Settings, scenarios, the window's dialogs and themes need these names and defaults; importing
them must not load the native library (only `engine.llm.llama` talks to llama.cpp, and it maps
these values onto llama.cpp's).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from engine.core.schedule import DEFAULT_INTERVAL

# The K/V cache element types a context can use, by name (engine.llm.llama maps them to ggml's).
KV_TYPE_NAMES = ("f32", "f16", "q8_0", "q4_0")


class FlashAttention(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


@dataclass(frozen=True)
class ContextParams:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0  # 0 = automatic: the physical cores less one (engine.llm.llama)
    flash_attn: FlashAttention = FlashAttention.OFF
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = False


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


GPU_LAYERS_FIT = -2  # as many layers on the GPU as fit its free memory, as llama.cpp fits them


@dataclass(frozen=True)
class RuntimeSettings:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0
    n_gpu_layers: int = 0  # -1: every layer; GPU_LAYERS_FIT: all that fit (llama.cpp's fit)
    context: ContextParams | None = None  # flash attention, K/V types, swa_full
    rpc_workers: tuple[str, ...] = ()  # llama.cpp RPC workers (host:port) that take layers

    def context_params(self) -> ContextParams:
        base = self.context or ContextParams()
        return ContextParams(
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            n_threads=self.n_threads,
            flash_attn=base.flash_attn,
            type_k=base.type_k,
            type_v=base.type_v,
            swa_full=base.swa_full,
        )


class CacheMode(StrEnum):
    CHECKPOINTS = "checkpoints"  # reuse the live cache (and checkpoints) wherever valid
    NONE = "none"  # clear the context and decode the whole prompt at every step


@dataclass(frozen=True)
class CheckpointOptions:
    interval: int = DEFAULT_INTERVAL
    ram_budget: int | None = None  # bytes; None = the default from the machine's memory
    disk_dir: Path | None = None  # the disk tier; None = RAM only
    disk_budget: int = 8 << 30
