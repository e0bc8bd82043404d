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

from engine.checkpoints import Checkpoint, Identity
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
from engine.model import MemoryKind, file_sha256

log = logging.getLogger(__name__)

MIN_TAIL = 2  # tokens always decoded for a prompt: logits, and batched (not single) kernels
STATE_FLAGS = 0  # full per-sequence state: the only kind safe for every memory kind

ProgressFn = Callable[[int, int], None]  # (tokens decoded so far, tokens to decode)
TokenFn = Callable[[int, str], None]  # (token id, text it added)
CancelFn = Callable[[], bool]
# (prompt tokens, tokens reused, where they came from, the checkpoint's last position or None),
# called once the plan is fixed and before decoding starts: what the progress bar says.
PlanFn = Callable[[int, int, "Source", int | None], None]


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
    checkpoint_id: int | None = None
    failed_checkpoints: tuple[int, ...] = ()


@dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]
    text: str
    finish: FinishReason
    ttft_ms: float | None  # from the start of generate() to the first token
    decode_ms: float


class Runtime:
    """Owns one model and one context. Not thread-safe: one thread calls everything."""

    def __init__(
        self,
        model_path: Path,
        settings: RuntimeSettings | None = None,
        *,
        on_load_progress: Callable[[float], None] | None = None,
    ) -> None:
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
        self.model = LlamaModel(
            model_path, n_gpu_layers=n_gpu_layers, on_progress=on_load_progress
        )
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
        self._canonical = 0
        # The prompt-end checkpoint, taken after the first token is sampled (see prepare).
        self._pending_capture: Callable[[], None] | None = None
        log.info(
            "loaded %s: %s, memory %s, n_ctx %d, backend %s",
            model_path.name, self.model.description(), self.memory_kind, self.n_ctx, self.backend,
        )

    def close(self) -> None:
        self._pending_capture = None
        self.ctx.close()
        self.model.close()

    def identity(self) -> Identity:
        """What a state blob must have been made with to be loaded here."""
        params = self.ctx.params
        return Identity(
            model_sha256=file_sha256(self.model.path),
            llama_cpp_python=_llama_cpp_version(),
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            type_k=params.type_k,
            type_v=params.type_v,
            flash_attn=params.flash_attn.value,
            swa_full=params.swa_full,
            n_seq_max=1,
            flags=STATE_FLAGS,
        )

    # --- the live cache ----------------------------------------------------------------

    @property
    def live_tokens(self) -> tuple[int, ...]:
        """The tokens the context holds, positions 0..n-1."""
        return tuple(self._live)

    @property
    def canonical_tokens(self) -> int:
        """How many leading live tokens hold exactly the state a full prompt decode gives.

        Tokens decoded one at a time during generation take llama.cpp's single-token
        kernels, whose results differ from a batched decode of the same tokens (on
        SmolLM2 Q4_1, by up to 0.46 in the logits after 64 tokens). Reusing them would
        break the invariant, so they are decoded again, batched, when a prompt needs them.
        """
        return self._canonical

    def clear(self) -> None:
        self.flush_capture()
        self.ctx.clear()
        self._live = []
        self._canonical = 0

    def live_reuse(self, target: Sequence[int]) -> int:
        """How many leading tokens of `target` the live cache can keep, for this memory kind.

        At least MIN_TAIL tokens of the target are always left to decode (saved state holds
        no logits, and a one-token decode is not bit-identical to a batched one). The answer
        never comes from `seq_rm`'s return value: it comes from the memory kind and the
        positions llama.cpp reports.
        """
        live = self._live[: self._canonical]
        limit = len(target) - MIN_TAIL
        if not live or limit <= 0:
            return 0
        if self.memory_kind in (MemoryKind.RECURRENT, MemoryKind.HYBRID):
            # The state cannot be cut back: usable only if it is all canonical and a prefix
            # of the target that leaves a tail to decode.
            n = len(live)
            ok = n == len(self._live) and n <= limit and list(target[:n]) == live
            return n if ok else 0
        reuse = min(_common_prefix(live, target), limit)
        return reuse if reuse > 0 and self._window_holds(reuse) else 0

    def _window_holds(self, n: int) -> bool:
        """Whether the cache holds what a token at position `n` attends to.

        Dense caches must start at position 0. Sliding-window caches drop positions below
        the window, and `seq_rm` returns true even when it leaves nothing usable (LESSONS),
        so `pos_min` decides. Recurrent state has no positions to check here.
        """
        if self.memory_kind is MemoryKind.DENSE:
            return self.ctx.pos_min() == 0
        if self.memory_kind is MemoryKind.SLIDING_WINDOW:
            return self.ctx.pos_min() <= max(0, n - max(1, self.n_swa))
        return True

    # --- checkpoints -------------------------------------------------------------------

    def capture(self, node_id: int | None = None) -> Checkpoint:
        """Save the state of the live tokens. Only canonical state is worth saving."""
        if self._canonical != len(self._live) or not self._live:
            raise RuntimeError("capture() needs a live cache that holds only prompt tokens")
        blob = self.ctx.state_get(STATE_FLAGS)
        return Checkpoint(tokens=tuple(self._live), blob=blob, flags=STATE_FLAGS, node_id=node_id)

    def restore(self, checkpoint: Checkpoint) -> bool:
        """Load a checkpoint and verify it. On any failure the sequence is cleared."""
        self.flush_capture()
        self.clear()
        problem = self._load_and_verify(checkpoint)
        if problem is not None:
            log.warning("checkpoint %d %s; dropping it", checkpoint.id, problem)
            self.clear()
            return False
        self._live = list(checkpoint.tokens)
        self._canonical = len(self._live)
        return True

    def _load_and_verify(self, checkpoint: Checkpoint) -> str | None:
        """Hand the blob to llama.cpp and check the result; the problem, or None."""
        if checkpoint.blob is None:
            return "has no state loaded"
        read = self.ctx.state_set(checkpoint.blob, checkpoint.flags)
        if read != checkpoint.size:
            return f"was read as {read} of {checkpoint.size} bytes"
        pos_max = self.ctx.pos_max()
        if pos_max != checkpoint.pos_max:
            return f"restored to position {pos_max}, expected {checkpoint.pos_max}"
        if not self._window_holds(checkpoint.n_tokens):
            return "lacks the tokens the next ones attend to"
        return None

    # --- preparing a prompt -------------------------------------------------------------

    def prepare(
        self,
        target: Sequence[int],
        *,
        use_live: bool = True,
        checkpoints: Sequence[Checkpoint] = (),
        fetch: Callable[[Checkpoint], Checkpoint | None] | None = None,
        save_at: Sequence[int] = (),
        on_checkpoint: Callable[[Checkpoint], None] | None = None,
        on_progress: ProgressFn | None = None,
        on_plan: PlanFn | None = None,
        cancel: CancelFn | None = None,
    ) -> PrepareReport:
        """Bring the context to hold exactly `target`, with logits for its last token.

        A checkpoint asked for at the very end of the target is taken later, by
        `flush_capture`: `generate` calls it once the first token is sampled (sampling reads
        the logits and leaves the cache as it is), so copying the cache costs no time to the
        first token. Anything that changes the context flushes it first.

        Candidates are the live cache and every checkpoint whose tokens are a prefix of the
        target leaving at least MIN_TAIL tokens; the one that leaves the least to decode
        wins (ties go to the live cache). Every restore is verified; a failed one is
        reported in `failed_checkpoints` and the next candidate is tried. While decoding,
        the state is captured after each position in `save_at` and passed to
        `on_checkpoint`.
        """
        self.flush_capture()
        target = list(target)
        if len(target) < MIN_TAIL:
            raise ValueError(f"a prompt needs at least {MIN_TAIL} tokens")
        if len(target) >= self.n_ctx:
            raise ContextOverflowError(len(target), self.n_ctx)
        started = time.perf_counter()
        limit = len(target) - MIN_TAIL
        plans: list[tuple[int, int, Checkpoint | None]] = []
        if use_live:
            plans.append((self.live_reuse(target), 1, None))
        for checkpoint in checkpoints:
            if checkpoint.n_tokens <= limit and checkpoint.is_prefix_of(target):
                plans.append((checkpoint.n_tokens, 0, checkpoint))
        plans.sort(key=lambda plan: (plan[0], plan[1]), reverse=True)
        failed: list[int] = []
        reuse, source, used = 0, Source.NONE, None
        for n, _, checkpoint in plans:
            if n == 0:
                break
            if checkpoint is None:
                reuse = self._keep_live_prefix(n)
                if reuse:
                    source = Source.LIVE
                    break
            else:
                loaded = checkpoint if checkpoint.blob is not None or fetch is None else fetch(
                    checkpoint
                )
                if loaded is not None and loaded.blob is not None and self.restore(loaded):
                    reuse, source, used = n, Source.CHECKPOINT, checkpoint
                    break
                failed.append(checkpoint.id)
        if source is Source.NONE:
            self.clear()
        if on_plan is not None:
            on_plan(len(target), reuse, source, used.pos_max if used is not None else None)
        saves = sorted({p for p in save_at if reuse < p <= len(target)})
        self._decode_tail(target, reuse, saves, on_checkpoint, on_progress, cancel)
        return PrepareReport(
            prompt_tokens=len(target),
            reused_tokens=reuse,
            decoded_tokens=len(target) - reuse,
            source=source,
            checkpoint_pos=used.pos_max if used is not None else None,
            prefill_ms=(time.perf_counter() - started) * 1000.0,
            checkpoint_id=used.id if used is not None else None,
            failed_checkpoints=tuple(failed),
        )

    def _keep_live_prefix(self, reuse: int) -> int:
        """Cut the live cache back to `reuse` tokens and check that it really holds them."""
        if reuse < len(self._live) and not self.ctx.seq_rm(reuse, -1):
            log.info("seq_rm(%d) refused; decoding from scratch", reuse)
            self.clear()
            return 0
        del self._live[reuse:]
        self._canonical = min(self._canonical, reuse)
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
        saves: list[int],
        on_checkpoint: Callable[[Checkpoint], None] | None,
        on_progress: ProgressFn | None,
        cancel: CancelFn | None,
    ) -> None:
        total = len(target) - start
        if on_progress:
            on_progress(0, total)
        ends = chunk_ends(start, len(target), self.n_batch, saves)
        self.ctx.arm_abort(cancel)
        try:
            position = start
            for end in ends:
                if cancel and cancel():
                    raise Cancelled()
                chunk = target[position:end]
                status = self.ctx.decode(chunk, position, want_logits=end == len(target))
                if status == 2:
                    self._resync_after_abort(target)
                    raise Cancelled()
                self._live.extend(chunk)
                self._canonical = len(self._live)
                position = end
                if end in saves and on_checkpoint is not None:
                    if end == len(target):
                        self._pending_capture = self._capture_into(on_checkpoint)
                    else:
                        on_checkpoint(self.capture())
                if on_progress:
                    on_progress(end - start, total)
        except ArborError:
            raise
        except BaseException:
            self._resync_after_abort(target)
            raise
        finally:
            self.ctx.arm_abort(None)

    def _capture_into(self, keep: Callable[[Checkpoint], None]) -> Callable[[], None]:
        held = len(self._live)

        def capture() -> None:
            if len(self._live) == held and self._canonical == held:
                keep(self.capture())
            else:  # cannot happen while every change flushes first; never save a wrong state
                log.warning("deferred checkpoint dropped: the context changed before it")

        return capture

    def flush_capture(self) -> None:
        """Take the deferred prompt-end checkpoint now, if one is waiting."""
        pending, self._pending_capture = self._pending_capture, None
        if pending is not None:
            pending()

    def _resync_after_abort(self, target: Sequence[int]) -> None:
        """After an aborted decode, make `live_tokens` match what the cache still holds."""
        if self.memory_kind in (MemoryKind.RECURRENT, MemoryKind.HYBRID):
            # An aborted graph may have half-updated the recurrent state: drop it.
            self.clear()
            return
        held = self.ctx.pos_max() + 1
        if held <= len(target):
            self._live = list(target[:held])
            self._canonical = held
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
                self.flush_capture()  # after the first token is out, before the cache moves
                # One token per decode; cancellation is checked between tokens, so the abort
                # callback stays disarmed and the cache never holds a half-decoded token.
                self.ctx.decode([token], len(self._live))
                self._live.append(token)
        finally:
            sampler.close()
            self.flush_capture()  # a reply that ended before its first decode
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


def chunk_ends(start: int, end: int, n_batch: int, splits: Sequence[int] = ()) -> list[int]:
    """Where each decode chunk of positions [start, end) ends.

    Chunks hold at most `n_batch` tokens and end at every split position that leaves both
    sides at least MIN_TAIL tokens; no chunk is ever a single token, because llama.cpp's
    single-token kernels round differently from batched ones.
    """
    if end - start < MIN_TAIL:
        raise ValueError(f"a decode needs at least {MIN_TAIL} tokens, not {end - start}")
    if n_batch < MIN_TAIL:
        raise ValueError(f"n_batch must be at least {MIN_TAIL}")
    points = sorted({s for s in splits if start + MIN_TAIL <= s <= end - MIN_TAIL})
    points.append(end)
    ends: list[int] = []
    position = start
    for stop in points:
        if stop - position < MIN_TAIL:
            continue
        while stop - position > n_batch:
            remaining = stop - position
            step = n_batch if remaining - n_batch >= MIN_TAIL else remaining - MIN_TAIL
            position += step
            ends.append(position)
        ends.append(stop)
        position = stop
    return ends


def _llama_cpp_version() -> str:
    from importlib import metadata

    return metadata.version("llama-cpp-python")


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
