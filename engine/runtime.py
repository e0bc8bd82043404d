"""The one llama.cpp context: prepare a prompt with the least decoding, then generate.

`Runtime.prepare(target)` brings the context to hold exactly `target`, reusing what the live
cache holds where that is valid for the model's memory kind (DESIGN.md, "Preparing a prompt"),
and decoding the rest in `n_batch` chunks. `Runtime.generate()` then samples token by token.
Both honour a cancel check: between chunks, inside a chunk (llama.cpp's abort callback) and
between tokens, and both leave `live_tokens` equal to what the cache really holds.
"""

from __future__ import annotations

import codecs
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from engine.errors import ArborError, Cancelled, ContextOverflowError
from engine.llama import (
    ContextParams,
    LlamaContext,
    LlamaModel,
    Sampler,
    SamplingParams,
    gpu_backend_name,
    supports_gpu_offload,
)
from engine.model import MemoryKind

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]  # (tokens decoded so far, tokens to decode)
TokenFn = Callable[[int, str], None]  # (token id, text it added)
CancelFn = Callable[[], bool]


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
class RuntimeSettings:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0
    n_gpu_layers: int = 0
    context: ContextParams | None = None  # flash attention, K/V types, swa_full

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


@dataclass(frozen=True)
class PrepareReport:
    prompt_tokens: int
    reused_tokens: int
    decoded_tokens: int
    source: Source
    checkpoint_pos: int | None
    prefill_ms: float


@dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]
    text: str
    finish: FinishReason
    ttft_ms: float | None  # from the start of generate() to the first token
    decode_ms: float


class Runtime:
    """Owns one model and one context. Not thread-safe: one thread calls everything."""

    def __init__(self, model_path: Path, settings: RuntimeSettings | None = None) -> None:
        self.settings = settings or RuntimeSettings()
        self.notices: list[str] = []
        n_gpu_layers = self.settings.n_gpu_layers
        if n_gpu_layers != 0 and not supports_gpu_offload():
            message = (
                "GPU offload was requested but this llama.cpp build has no GPU backend; "
                "running on the CPU"
            )
            log.warning(message)
            self.notices.append(message)
            n_gpu_layers = 0
        self.backend = (gpu_backend_name() or "CPU") if n_gpu_layers != 0 else "CPU"
        self.model = LlamaModel(model_path, n_gpu_layers=n_gpu_layers)
        try:
            self.ctx = LlamaContext(self.model, self.settings.context_params())
        except ArborError:
            self.model.close()
            raise
        params = self.ctx.params
        self.memory_kind = self.model.memory_kind(swa_full=params.swa_full)
        self.n_swa = self.model.n_swa
        self.n_ctx = self.ctx.n_ctx
        self.n_batch = params.n_batch
        self._live: list[int] = []
        log.info(
            "loaded %s: %s, memory %s, n_ctx %d, backend %s",
            model_path.name, self.model.description(), self.memory_kind, self.n_ctx, self.backend,
        )

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    # --- the live cache ----------------------------------------------------------------

    @property
    def live_tokens(self) -> tuple[int, ...]:
        """The tokens the context holds, positions 0..n-1."""
        return tuple(self._live)

    def clear(self) -> None:
        self.ctx.clear()
        self._live = []

    def live_reuse(self, target: Sequence[int]) -> int:
        """How many leading tokens of `target` the live cache can keep, for this memory kind.

        At least one token of the target is always left to decode: saved state holds no
        logits. The answer never comes from `seq_rm`'s return value: it comes from the
        memory kind and the positions llama.cpp reports.
        """
        live = self._live
        if not live or not target:
            return 0
        if self.memory_kind in (MemoryKind.RECURRENT, MemoryKind.HYBRID):
            # The state cannot be cut back: usable only if it is a strict prefix of the target.
            n = len(live)
            return n if n < len(target) and list(target[:n]) == live else 0
        common = _common_prefix(live, target)
        reuse = min(common, len(target) - 1)
        if self.memory_kind is MemoryKind.SLIDING_WINDOW and reuse > 0:
            # The window below the new tokens must still be held (LESSONS: seq_rm says true
            # and silently empties the sequence when it is not).
            if self.ctx.pos_min() > max(0, reuse - max(1, self.n_swa)):
                return 0
        return reuse

    # --- preparing a prompt -------------------------------------------------------------

    def prepare(
        self,
        target: Sequence[int],
        *,
        use_live: bool = True,
        on_progress: ProgressFn | None = None,
        cancel: CancelFn | None = None,
    ) -> PrepareReport:
        """Bring the context to hold exactly `target`, with logits for its last token."""
        target = list(target)
        if not target:
            raise ValueError("cannot prepare an empty prompt")
        if len(target) >= self.n_ctx:
            raise ContextOverflowError(len(target), self.n_ctx)
        started = time.perf_counter()
        reuse = self.live_reuse(target) if use_live else 0
        reuse = self._keep_live_prefix(reuse)
        source = Source.LIVE if reuse > 0 else Source.NONE
        self._decode_tail(target, reuse, on_progress, cancel)
        return PrepareReport(
            prompt_tokens=len(target),
            reused_tokens=reuse,
            decoded_tokens=len(target) - reuse,
            source=source,
            checkpoint_pos=None,
            prefill_ms=(time.perf_counter() - started) * 1000.0,
        )

    def _keep_live_prefix(self, reuse: int) -> int:
        """Cut the live cache back to `reuse` tokens and check that it really holds them."""
        if reuse == 0:
            self.clear()
            return 0
        if reuse < len(self._live) and not self.ctx.seq_rm(reuse, -1):
            log.info("seq_rm(%d) refused; decoding from scratch", reuse)
            self.clear()
            return 0
        del self._live[reuse:]
        if self.ctx.pos_max() != reuse - 1:
            log.warning(
                "live cache holds up to position %d, expected %d; decoding from scratch",
                self.ctx.pos_max(), reuse - 1,
            )
            self.clear()
            return 0
        return reuse

    def _decode_tail(
        self,
        target: list[int],
        start: int,
        on_progress: ProgressFn | None,
        cancel: CancelFn | None,
    ) -> None:
        total = len(target) - start
        done = 0
        if on_progress:
            on_progress(0, total)
        self.ctx.arm_abort(cancel)
        try:
            for chunk_start in range(start, len(target), self.n_batch):
                if cancel and cancel():
                    raise Cancelled()
                chunk = target[chunk_start : chunk_start + self.n_batch]
                last = chunk_start + len(chunk) == len(target)
                status = self.ctx.decode(chunk, chunk_start, want_logits=last)
                if status == 2:
                    self._resync_after_abort(target)
                    raise Cancelled()
                self._live.extend(chunk)
                done += len(chunk)
                if on_progress:
                    on_progress(done, total)
        except ArborError:
            raise
        except BaseException:
            self._resync_after_abort(target)
            raise
        finally:
            self.ctx.arm_abort(None)

    def _resync_after_abort(self, target: Sequence[int]) -> None:
        """After an aborted decode, make `live_tokens` match what the cache still holds."""
        if self.memory_kind in (MemoryKind.RECURRENT, MemoryKind.HYBRID):
            # An aborted graph may have half-updated the recurrent state: drop it.
            self.clear()
            return
        held = self.ctx.pos_max() + 1
        if held <= len(target):
            self._live = list(target[:held])
        else:
            self.clear()

    # --- generating --------------------------------------------------------------------

    def generate(
        self,
        *,
        max_tokens: int,
        sampling: SamplingParams,
        seed: int,
        on_token: TokenFn | None = None,
        cancel: CancelFn | None = None,
    ) -> Generation:
        """Sample a reply after `prepare()`. Stops at end-of-generation, max_tokens, a full
        context or cancellation; the cache then holds the prompt and every decoded token."""
        if not self._live:
            raise RuntimeError("generate() needs a prepared prompt")
        started = time.perf_counter()
        sampler = Sampler(sampling, seed)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        tokens: list[int] = []
        pieces: list[str] = []
        ttft_ms: float | None = None
        finish = FinishReason.LENGTH
        try:
            while len(tokens) < max_tokens:
                if cancel and cancel():
                    finish = FinishReason.CANCELLED
                    break
                token = sampler.sample(self.ctx)
                if ttft_ms is None:
                    ttft_ms = (time.perf_counter() - started) * 1000.0
                if self.model.is_eog(token):
                    finish = FinishReason.STOP
                    break
                tokens.append(token)
                piece = decoder.decode(self.model.token_bytes(token))
                pieces.append(piece)
                if on_token:
                    on_token(token, piece)
                if len(tokens) >= max_tokens:
                    break
                if len(self._live) + 1 >= self.n_ctx:
                    finish = FinishReason.CONTEXT_FULL
                    break
                # One token per decode; cancellation is checked between tokens, so the abort
                # callback stays disarmed and the cache never holds a half-decoded token.
                self.ctx.decode([token], len(self._live))
                self._live.append(token)
        finally:
            sampler.close()
        pieces.append(decoder.decode(b"", final=True))
        return Generation(
            tokens=tuple(tokens),
            text="".join(pieces),
            finish=finish,
            ttft_ms=ttft_ms,
            decode_ms=(time.perf_counter() - started) * 1000.0,
        )

    def last_logits(self) -> np.ndarray:
        """The logits of the last decoded token (for tests of the invariant)."""
        return self.ctx.logits()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
