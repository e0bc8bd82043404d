"""Whether a model fits this machine, computed from its GGUF header and file size.

The need is the sum of what llama.cpp allocates for it plus what Arbor keeps beside it:

* the weights: the file's bytes (all parts of a split model), mapped or loaded whole;
* the cache at the chosen context: per attention layer, K and V rows of
  `head_count_kv * key_length` (and `value_length`) elements of the K/V type, for the whole
  context, or for `sliding_window + n_ubatch` positions on a sliding-window layer (as
  llama.cpp sizes its SWA cache); per recurrent layer, the fixed f32 state (Mamba's
  convolution and SSM state, RWKV's token shift and WKV state, LFM2's short convolution);
* the compute buffers llama.cpp reserves for one batch: the logits (`n_vocab * n_ubatch`
  floats) and, without flash attention, one layer's attention scores
  (`head_count * n_ctx * n_ubatch` floats);
* the checkpoint budget: the RAM Arbor may fill with checkpoints (Settings).

With a GPU (`GpuMemory`, which the engine process measures: the window's never loads
llama.cpp), the weights, cache and buffers go to its memory first and what does not fit there
stays in RAM beside the checkpoints.

Every term comes from the header; when a key is missing the estimate takes the larger
reading (every layer full attention, a large vocabulary), so "fits" is not said lightly.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from engine.core.memory import MemoryKind
from engine.models.files import summarize_header
from engine.models.gguf_header import Value

MIN_CONTEXT = 2048  # below this a chat model is not worth offering "with a smaller context"
CONTEXT_STEP = 256
N_UBATCH = 512
UNKNOWN_VOCAB = 152064  # the largest common vocabulary (Qwen's), when the header omits it
# llama.cpp's default layer patterns for architectures whose GGUF does not list which layers
# slide: a layer slides unless its index is the last of each group of this many.
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "llama4": 4}
_KV_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
             "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}


class Verdict(StrEnum):
    FITS = "fits"
    SMALLER_CONTEXT = "fits with a smaller context"
    DOES_NOT_FIT = "does not fit"


@dataclass(frozen=True)
class Shape:
    """The sizes in a header that memory depends on."""

    architecture: str
    memory_kind: MemoryKind
    n_layer: int
    n_head: int
    kv_heads: tuple[int, ...]  # per layer; 0 marks a layer without attention (recurrent)
    key_length: int
    value_length: int
    sliding_window: int | None
    swa_layers: tuple[bool, ...]  # per layer: does it slide
    recurrent_layers: tuple[bool, ...]  # per layer: does it keep a recurrent state
    state_per_layer: int  # bytes of recurrent state per recurrent layer
    n_vocab: int
    trained_context: int | None


@dataclass(frozen=True)
class MemoryNeed:
    weights: int
    cache: int  # K/V and recurrent state at the context size
    compute: int
    checkpoints: int

    @property
    def total(self) -> int:
        return self.weights + self.cache + self.compute + self.checkpoints

    @property
    def on_device(self) -> int:
        """What a GPU would hold with every layer on it (checkpoints stay in RAM)."""
        return self.weights + self.cache + self.compute


@dataclass(frozen=True)
class GpuMemory:
    """This machine's GPUs' memory as the engine process measures it, summed over them (an RPC
    worker's devices are not counted)."""

    free: int  # free now
    total: int
    margin: int = 0  # what llama.cpp's fit leaves free: a margin on every GPU
    held: int = 0  # what the loaded model holds on them (0 when none is loaded)

    @property
    def for_a_model(self) -> int:
        """What a model loaded in place of the current one may take: the free memory and the
        current model's share, less the margin."""
        return max(0, self.free + self.held - self.margin)


@dataclass(frozen=True)
class Fit:
    verdict: Verdict
    n_ctx: int  # the context asked for, or the largest that fits (SMALLER_CONTEXT)
    need: MemoryNeed  # at n_ctx
    free_ram: int
    free_vram: int | None
    all_on_gpu: bool  # weights, cache and buffers fit the free VRAM


def shape_of(fields: dict[str, Value]) -> Shape:
    """The memory-relevant sizes of a header (read with `wanted_header_key`)."""
    summary = summarize_header(fields, "")
    arch = summary.architecture

    def num(key: str, default: int = 0) -> int:
        value = fields.get(f"{arch}.{key}")
        if isinstance(value, list):
            ints = [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
            return max(ints) if ints else default
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    n_layer = num("block_count", 1)
    n_embd = num("embedding_length")
    n_head = num("attention.head_count")
    raw_kv = fields.get(f"{arch}.attention.head_count_kv")
    if isinstance(raw_kv, list) and len(raw_kv) == n_layer:
        kv_heads = tuple(int(v) for v in raw_kv)
    else:
        kv_heads = (num("attention.head_count_kv", n_head),) * n_layer
    head_dim = n_embd // n_head if n_head else 0
    key_length = num("attention.key_length", head_dim)
    value_length = num("attention.value_length", head_dim)
    kind = summary.memory_kind
    swa_layers = _swa_layers(arch, fields, n_layer, summary.sliding_window)
    if kind is MemoryKind.RECURRENT:
        recurrent = (True,) * n_layer
        kv_heads = (0,) * n_layer
    elif kind is MemoryKind.HYBRID:
        listed = isinstance(raw_kv, list) and len(raw_kv) == n_layer
        recurrent = tuple(h == 0 for h in kv_heads) if listed else (True,) * n_layer
    else:
        recurrent = (False,) * n_layer
    vocab = num("vocab_size", UNKNOWN_VOCAB)
    return Shape(
        architecture=arch, memory_kind=kind, n_layer=n_layer, n_head=n_head,
        kv_heads=kv_heads, key_length=key_length, value_length=value_length,
        sliding_window=summary.sliding_window, swa_layers=swa_layers,
        recurrent_layers=recurrent, state_per_layer=_state_bytes(arch, num, n_embd),
        n_vocab=vocab, trained_context=summary.context_length,
    )


def _swa_layers(arch: str, fields: dict[str, Value], n_layer: int,
                window: int | None) -> tuple[bool, ...]:
    if not window:
        return (False,) * n_layer
    listed = fields.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(listed, list) and len(listed) == n_layer:
        return tuple(bool(v) for v in listed)
    pattern = listed if isinstance(listed, int) and not isinstance(listed, bool) else None
    pattern = pattern or _SWA_PATTERN.get(arch)
    if pattern is None:
        return (False,) * n_layer  # unknown: count every layer as full attention
    return tuple(i % pattern < pattern - 1 for i in range(n_layer))


def _state_bytes(arch: str, get: Callable[[str, int], int], n_embd: int) -> int:
    """f32 bytes of recurrent state per recurrent layer (one sequence), as llama.cpp keeps."""
    if arch.startswith(("rwkv", "arwkv")):
        head_size = get("wkv.head_size", 64)
        shift = get("token_shift_count", 2)
        return 4 * (shift * n_embd + n_embd * head_size)
    if arch == "lfm2":
        return 4 * (max(get("shortconv.l_cache", 3) - 1, 0) * n_embd)
    d_conv = get("ssm.conv_kernel", 4)
    d_inner = get("ssm.inner_size", 2 * n_embd)
    d_state = get("ssm.state_size", 16)
    groups = get("ssm.group_count", 0)
    conv = max(d_conv - 1, 0) * (d_inner + 2 * groups * d_state)
    return 4 * (conv + d_state * d_inner)


def memory_need(shape: Shape, weights: int, n_ctx: int, checkpoint_budget: int, *,
                type_k: str = "f16", type_v: str = "f16", flash_attn: bool = False,
                swa_full: bool = False) -> MemoryNeed:
    """What the model needs at `n_ctx` (see the module's docstring for each term)."""
    k_bytes, v_bytes = _KV_BYTES.get(type_k, 2.0), _KV_BYTES.get(type_v, 2.0)
    cache = 0.0
    for layer in range(shape.n_layer):
        heads = shape.kv_heads[layer]
        if heads:
            cells = n_ctx
            if shape.swa_layers[layer] and not swa_full and shape.sliding_window:
                cells = min(n_ctx, shape.sliding_window + N_UBATCH)
            cache += cells * heads * (shape.key_length * k_bytes + shape.value_length * v_bytes)
        if shape.recurrent_layers[layer]:
            cache += shape.state_per_layer
    compute = 4 * shape.n_vocab * N_UBATCH
    if not flash_attn and any(shape.kv_heads):
        compute += 4 * max(shape.n_head, 1) * n_ctx * N_UBATCH
    return MemoryNeed(weights=weights, cache=int(cache), compute=compute,
                      checkpoints=checkpoint_budget)


def check_fit(shape: Shape, weights: int, n_ctx: int, *, free_ram: int,
              checkpoint_budget: int, free_vram: int | None = None, type_k: str = "f16",
              type_v: str = "f16", flash_attn: bool = False) -> Fit:
    """Fits at `n_ctx`; else the largest context (a multiple of 256, at least MIN_CONTEXT)
    that fits; else does not fit. With `free_vram`, the layers go to the GPU first and what
    does not fit there stays in RAM beside the checkpoints."""

    def need_at(ctx: int) -> MemoryNeed:
        return memory_need(shape, weights, ctx, checkpoint_budget, type_k=type_k,
                           type_v=type_v, flash_attn=flash_attn)

    def fits(need: MemoryNeed) -> bool:
        spill = max(0, need.on_device - (free_vram or 0))
        return spill + need.checkpoints <= free_ram

    def verdict(v: Verdict, ctx: int, need: MemoryNeed) -> Fit:
        on_gpu = free_vram is not None and need.on_device <= free_vram
        return Fit(v, ctx, need, free_ram, free_vram, on_gpu)

    need = need_at(n_ctx)
    if fits(need):
        return verdict(Verdict.FITS, n_ctx, need)
    low, high = MIN_CONTEXT // CONTEXT_STEP, (n_ctx - 1) // CONTEXT_STEP
    if low > high or not fits(need_at(low * CONTEXT_STEP)):
        return verdict(Verdict.DOES_NOT_FIT, n_ctx, need)
    while low < high:  # the need grows with the context: the largest step that fits
        mid = (low + high + 1) // 2
        if fits(need_at(mid * CONTEXT_STEP)):
            low = mid
        else:
            high = mid - 1
    ctx = low * CONTEXT_STEP
    return verdict(Verdict.SMALLER_CONTEXT, ctx, need_at(ctx))


def available_ram() -> int:
    """The memory the system can give a new program now (Linux: MemAvailable), else the
    free physical pages; 0 when neither is known."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
