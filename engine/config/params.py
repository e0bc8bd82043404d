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
class LazyGrammar:
    """Where a lazy grammar holds (a tool call under tool_choice "auto", as llama-server
    makes one): the reply is free until it writes `trigger`; from there on the grammar of
    `SamplingParams.json_schema` between `json_around` holds (whitespace at their edges is
    free), and once that JSON is complete the reply is free again until the next trigger.
    Until a trigger the reply is the one the same sampler writes without any grammar."""

    trigger: str  # the text a call begins with (its format's marker)
    at_open: bool = False  # a reply whose text opens with "{" begins one too (Llama 3's)
    joiner: str = ""  # between the JSON values after one trigger ("," in Mistral's list)
    written: str = ""  # the reply's text before this generation (a continued reply's)
    # The grammar holds once, to the reply's end (what a reasoning reply must write after its
    # reasoning: a forced call, JSON output), instead of the reply going free after it.
    once: bool = False


@dataclass(frozen=True)
class SamplingParams:
    """How a reply's tokens are drawn: llama.cpp's samplers, applied in llama-server's order
    (logit bias, the JSON grammar, penalties, top-k, top-p, min-p, temperature). The
    penalties count the prompt's last `penalty_last_n` tokens too, as llama-server's do."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0  # a repeated token's logit divided by it (1: off)
    frequency_penalty: float = 0.0  # minus this times the token's count so far
    presence_penalty: float = 0.0  # minus this once the token has appeared
    penalty_last_n: int = 64  # how many of the latest tokens the penalties count
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    # The JSON schema (its JSON text) the reply must follow, by a llama.cpp grammar; None: free.
    json_schema: str | None = None
    json_around: tuple[str, str] = ("", "")  # literal text the JSON comes between
    json_lazy: LazyGrammar | None = None  # None: the grammar holds from the reply's start
    # A GBNF grammar (rooted at `root`) instead of a JSON schema's: a tool call in a format
    # that is not JSON (engine.core.call_formats); `json_lazy` applies to it the same way.
    grammar: str | None = None
    # When the conversation offers tools (engine.core.tools): "auto" (the model may call
    # them), "required" (it must call one) or a tool's name (it must call that one); a
    # forced call is made by a grammar of the tools' schemas in the model's call format.
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True  # False: only the reply's first call counts
    # Each generated token's log-probability and this many likeliest alternatives (OpenAI's
    # logprobs and top_logprobs); None: not computed. Sampling is unchanged by it.
    top_logprobs: int | None = None

    @property
    def penalized(self) -> bool:
        return (self.penalty_last_n != 0 and (self.repeat_penalty != 1.0
                                              or self.frequency_penalty != 0.0
                                              or self.presence_penalty != 0.0))

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
