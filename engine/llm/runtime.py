"""The one llama.cpp context: prepare a prompt with the least decoding, then generate.

`Runtime.prepare(target, marks=...)` brings the context to hold exactly `target`, reusing what
the live cache or a checkpoint holds where that is valid for the model's memory kind
(docs/architecture.md, "Preparing a prompt"), and decoding the rest in the chunks of the
target's decode schedule (`engine.core.schedule`): the same chunks whatever was reused, so the
result never depends on what the cache did. `Runtime.generate()` then samples token by token.
Both honour a cancel check: between chunks, inside a chunk (llama.cpp's abort callback) and
between tokens, and both leave `live_tokens` equal to what the cache really holds. What the
context holds, and the checkpoints, settles and rescues of it, are `engine.llm.live`'s.
"""

from __future__ import annotations

import codecs
import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from engine.config.params import RuntimeSettings
from engine.core.errors import ArborError, Cancelled, ContextOverflowError
from engine.core.prefix import packed
from engine.core.results import (
    CancelFn,
    FinishReason,
    PlanFn,
    Prepared,
    ProgressFn,
    Reuse,
    Source,
    TokenFn,
    TokenLogprob,
)
from engine.core.schedule import CPU_GRID, GPU_GRID
from engine.llm.live import STATE_FLAGS, LiveState, PendingCapture
from engine.llm.llama import LlamaContext, LlamaModel, Sampler, SamplingParams, gpu_memory
from engine.llm.placement import place
from engine.models.files import file_sha256
from engine.models.fit import GpuMemory
from engine.storage.checkpoints import Checkpoint, Identity

log = logging.getLogger(__name__)

# The canary a load decodes before the model is called loaded: a batch as prompts are decoded
# (llama.cpp's AMX kernels crashed on any batch of 2 or more), then one token as replies are.
CANARY_TOKENS = 16



@dataclass(frozen=True)
class PrepareReport(Prepared):
    """A prepare's figures, with which checkpoint it restored and which ones it found bad."""

    checkpoint_id: int | None = None
    failed_checkpoints: tuple[int, ...] = ()


@dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]
    text: str
    finish: FinishReason
    ttft_ms: float | None  # from the start of generate() to the first token
    decode_ms: float
    logprobs: tuple[TokenLogprob, ...] = ()  # when sampling.top_logprobs asks for them


class Runtime(LiveState):
    """Owns one model and one context. Not thread-safe: one thread calls everything."""

    def __init__(
        self,
        model_path: Path,
        settings: RuntimeSettings | None = None,
        *,
        on_load_progress: Callable[[float], None] | None = None,
        repack: bool | None = None,
    ) -> None:
        """`repack`: False loads without weight repacking; None lets engine.llm.repack decide."""
        self.settings = settings or RuntimeSettings()
        placed = place(model_path, self.settings, repack)
        self.notices = placed.notices
        self.backend, self.devices = placed.backend, placed.devices
        self.repack, self.kernels = placed.repack, placed.kernels
        self._guard = placed.guard
        gpu, workers, context = placed.gpu, placed.workers, placed.context
        # Until the canary and the first prompt have been decoded, a fault of this process
        # means the fast kernels crash here (engine.llm.repack).
        if placed.repack:
            self._guard.arm()
        fit = placed.fit_layers() if placed.fitting else None
        n_gpu_layers = self.gpu_layers = fit.n_gpu_layers if fit is not None else \
            placed.n_gpu_layers
        before = gpu_memory() if gpu is not None else None
        try:
            self.model = LlamaModel(
                model_path, n_gpu_layers=n_gpu_layers, rpc_workers=workers,
                on_progress=on_load_progress, repack=placed.repack, fit=fit,
            )
            try:
                self.ctx = LlamaContext(self.model, context)
            except BaseException:
                self.model.close()
                raise
            try:
                self._canary()
            except BaseException:
                self.ctx.close()
                self.model.close()
                raise
        except BaseException:
            self._guard.disarm()
            raise
        # What this model holds on the GPUs: its weights, cache and the buffers the canary's
        # decodes allocated (another model still loaded holds the same before and after).
        after = gpu_memory() if before is not None else None
        self.gpu_held = (max(0, before.free - after.free)
                         if before is not None and after is not None else 0)
        grid = CPU_GRID if gpu is None else GPU_GRID
        super().__init__(self.ctx, self.model, grid=min(self.ctx.params.n_batch, grid))
        log.info(
            "loaded %s: %s, memory %s, n_ctx %d, backend %s",
            model_path.name, self.model.description(), self.memory_kind, self.n_ctx, self.backend,
        )

    def close(self) -> None:
        self._pending_capture = None
        self._guard.disarm()
        self.ctx.close()
        self.model.close()

    def _canary(self) -> None:
        """Decode a batch of tokens as a prompt is decoded, then one as a reply is, and
        forget them: a build whose kernels crash on this CPU does so here, before anyone is
        told the model is loaded (engine.llm.repack)."""
        n = max(1, min(CANARY_TOKENS, self.ctx.params.n_batch, self.ctx.n_ctx - 2))
        tokens = [(1000 + i) % self.model.n_vocab for i in range(n)]
        self.ctx.decode(tokens, 0)
        self.ctx.decode(tokens[:1], n)
        self.ctx.clear()

    def gpu_memory(self) -> GpuMemory | None:
        """The GPUs' memory now, with what this model holds there (None without a GPU)."""
        now = gpu_memory()
        return replace(now, held=self.gpu_held) if now is not None else None

    def report(self) -> dict[str, Any]:
        """The model and context, for reports (the replay report's `model`)."""
        model = self.model
        params = self.ctx.params
        return {
            "name": model.info.name,
            "path": str(model.path),
            "file_sha256": file_sha256(model.path),
            "architecture": model.info.architecture,
            "memory_kind": self.memory_kind.value,
            "n_swa": self.n_swa,
            "swa_full": params.swa_full,
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_params": model.n_params,
            "size_bytes": model.info.size_bytes,
            "backend": self.backend,
            "gpu_layers": self.gpu_layers,
            "kernels": self.kernels,
            "llama_cpp_python": metadata.version("llama-cpp-python"),
        }

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
            devices=self.devices,
            kernels=self.kernels,
        )

    # --- preparing a prompt -------------------------------------------------------------

    def prepare(
        self,
        target: Sequence[int],
        *,
        marks: Iterable[int] = (),
        use_live: bool = True,
        checkpoints: Sequence[Checkpoint] = (),
        fetch: Callable[[Checkpoint], Checkpoint | None] | None = None,
        save_at: Sequence[int] = (),
        partial_at: Collection[int] = (),
        twin_end: bool = False,
        on_checkpoint: Callable[[Checkpoint], None] | None = None,
        on_progress: ProgressFn | None = None,
        on_plan: PlanFn | None = None,
        cancel: CancelFn | None = None,
        scope: str = "",
    ) -> PrepareReport:
        """Bring the context to hold exactly `target`, with logits for its last token.

        `marks` are the path's structural positions (node ends, reply openings); with
        `n_batch` and the grid they fix the target's decode schedule, which every chunk
        decoded here follows. Candidates are the live cache and every checkpoint whose
        tokens are a prefix of the target and whose chunk ends agree with the schedule,
        ending before the target's last chunk, or at the target's end where they kept its
        last token's logits (then nothing is decoded: `generate` samples the first token
        from those logits); the one that leaves the least to decode wins (ties go to the
        live cache). Every restore is verified; a failed one is reported in
        `failed_checkpoints` and the next candidate is tried. A partial checkpoint is a
        candidate only while the live cache holds its prefix (`partial_states`). While
        decoding, the state is captured after each chunk end in `save_at` and passed to
        `on_checkpoint`: a partial state at those also in `partial_at` (where the model has
        one; else the whole state). `twin_end`: at the target's end, if it is in `save_at`
        as a whole state, a partial one too (on a hybrid, where it costs a fraction of a
        millisecond): what a swipe restores while the live cache still holds the prompt,
        in a fraction of the time the whole state takes (ties between checkpoints of the
        same length go to the partial one).

        `scope` is whose request this is (engine.storage.checkpoints): the live cache is a candidate
        only if it was prepared for the same scope, a checkpoint only if it was made for it.
        So what is reused never depends on another scope's requests.

        A checkpoint asked for at the very end of the target is taken later, by
        `flush_capture`: `generate` calls it once the first token is sampled (sampling reads
        the logits and leaves the cache as it is), so copying the cache costs no time to the
        first token; on a dense cache, and a hybrid's whole state beside its partial twin,
        once the reply is over (`LiveState.waits_for_reply`: the engine calls it after the
        request's last event). Anything that changes the context flushes it first.
        """
        self.flush_capture()
        target = list(target)
        if not target:
            raise ValueError("a prompt needs at least one token")
        if len(target) >= self.n_ctx:
            raise ContextOverflowError(len(target), self.n_ctx)
        schedule = self.schedule(len(target), marks)
        stray = sorted(set(save_at) - set(schedule.ends))
        if stray:
            raise ValueError(f"checkpoints can only be taken at chunk ends, not at {stray}")
        started = time.perf_counter()
        plans: list[tuple[int, int, Checkpoint | None]] = []
        # How far the live cache holds the target's state: partial checkpoints up to there
        # are candidates, until a failed restore clears it (`cleared`).
        held, cleared = 0, False
        if use_live and scope == self._live_scope:
            held = max(self._canonical_ends(target, schedule), default=0)
            if held == len(target):
                self._adopt_logits(len(target), checkpoints)
            plans.append((self.live_reuse(target, schedule), 2, None))
        key = packed(target)
        for checkpoint in checkpoints:
            if (checkpoint.scope == scope and checkpoint.fits(key, schedule)
                    and (not checkpoint.partial or checkpoint.n_tokens <= held)):
                plans.append((checkpoint.n_tokens, int(checkpoint.partial), checkpoint))
        plans.sort(key=lambda plan: (plan[0], plan[1]), reverse=True)
        failed: list[int] = []
        reuse, source, used = 0, Source.NONE, None
        for n, _, candidate in plans:
            if n == 0:
                break
            if candidate is None:
                reuse = self._keep_live_prefix(n)
                if reuse:
                    source = Source.LIVE
                    break
                cleared = True
            elif candidate.partial and cleared:
                continue  # the live cache it needed is gone
            else:
                loaded = candidate if candidate.blob is not None or fetch is None else fetch(
                    candidate
                )
                if (
                    loaded is not None and loaded.blob is not None
                    and (n < len(target) or loaded.logits is not None)
                    and self.restore(loaded)
                ):
                    reuse, source, used = n, Source.CHECKPOINT, candidate
                    break
                failed.append(candidate.id)
                cleared = True  # a failed restore clears the context
        if source is Source.NONE:
            self.clear()
        self._live_scope = scope  # what the cache holds now is this scope's alone
        if on_plan is not None:
            on_plan(Reuse(len(target), reuse, source,
                          used.pos_max if used is not None else None))
        saves = {p: self.partial_states and p in partial_at for p in save_at if p > reuse}
        twin = twin_end and self.partial_states and not self._settles
        self._decode_tail(target, schedule.chunks(reuse), saves, on_checkpoint, on_progress,
                          cancel, twin_end=twin)
        if self._guard.armed and len(target) - reuse > 1:
            self._guard.disarm()  # the model's first prompt decoded: these kernels work here
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

    def _decode_tail(
        self,
        target: list[int],
        ends: list[int],
        saves: dict[int, bool],
        on_checkpoint: Callable[[Checkpoint], None] | None,
        on_progress: ProgressFn | None,
        cancel: CancelFn | None,
        *,
        twin_end: bool = False,
    ) -> None:
        """Decode the chunks ending at `ends`, from where the live prefix ends, capturing
        the state at the chunk ends in `saves` (a partial state where it says True; at the
        target's end a partial one beside a whole one too, with `twin_end`)."""
        start = len(self._live)
        total = len(target) - start
        if on_progress:
            on_progress(0, total)
        self.ctx.arm_abort(cancel)
        try:
            position = start
            for end in ends:
                if cancel and cancel():
                    raise Cancelled()
                if self._settles and not self._settled and self._live:
                    self._settle_window()
                if cancel is not None:
                    self._save_rescue()
                chunk = target[position:end]
                self._stale = True
                status = self.ctx.decode(chunk, position, want_logits=end == len(target))
                if status == 2:
                    self._resync_after_abort()
                    raise Cancelled()
                self._live.extend(chunk)
                self._bounds.append(end)
                self._settled = False
                position = end
                keep = on_checkpoint if end in saves else None
                partial = saves.get(end, False)
                if end == len(target):
                    logits = self.ctx.logits()  # a copy: kept for a target ending here
                    logits.flags.writeable = False
                    self._end, self._stale = (end, logits), False
                    if keep is not None:
                        self._pending_capture = PendingCapture(
                            end, keep, partial, twin=twin_end and not partial)
                elif self._settles:  # before the next chunk; its blob is any save wanted
                    if keep is None:
                        self._settle_window()
                    else:
                        keep(self._settle(partial=partial))
                elif keep is not None:
                    keep(self.capture(partial=partial))
                if on_progress:
                    on_progress(end - start, total)
        except ArborError:
            raise
        except BaseException:
            self._resync_after_abort()
            raise
        finally:
            self.ctx.arm_abort(None)

    def _before_reply_decode(self) -> None:
        """Before the first reply token is decoded: take the deferred checkpoint (on a dense
        cache after the reply, and on a hybrid only the partial twin now:
        `LiveState.flush_capture`), and settle a sliding-window cache that holds exactly a
        prompt. A prompt's end is then settled in every mode, as its restored checkpoint is,
        so a reply decodes into the same cells whether the prompt was decoded, kept live or
        restored without a decode (on Gemma 3 270M the unsettled and the restored cache gave
        replies apart at once)."""
        n = len(self._live)
        if not (self._settles and not self._settled and self.canonical_tokens == n):
            pending = self._pending_capture
            if (pending is not None and pending.n == n and pending.twin
                    and self.canonical_tokens == n):
                # A hybrid: the partial twin now (under a millisecond), what a swipe restores
                # while the cache holds the prompt; the whole state (with the attention cache:
                # 40 ms at 16k tokens on the bench model, the twin's load included) once the
                # reply is over.
                base = self.capture(partial=True)
                pending.keep(base)
                self._pending_capture = replace(pending, twin=False, base=base)
            if not self.waits_for_reply():
                self.flush_capture()
            return
        pending, self._pending_capture = self._pending_capture, None
        if pending is not None and pending.n == n:  # (no twin: a window model's is 16 MB)
            pending.keep(self._settle(partial=pending.partial))  # the prompt-end checkpoint
        else:
            self._settle_window()

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
        # A prompt prepared without a decode: its last token's logits were kept, not output.
        held = self._logits_at(len(self._live)) if self._stale else None
        if self._stale and held is None:
            raise RuntimeError("generate() needs the logits of the prompt's last token")
        started = time.perf_counter()
        try:
            sampler = Sampler(sampling, seed, model=self.model, history=self._live)
        except BaseException:
            self.flush_capture()  # the prepared prompt's checkpoint is kept all the same
            raise
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        markers = self.model.call_markers  # shown in the text, unlike other special tokens
        tokens: list[int] = []
        pieces: list[str] = []
        logprobs: list[TokenLogprob] = []
        ttft_ms: float | None = None
        finish = FinishReason.LENGTH
        try:
            while len(tokens) < max_tokens:
                if cancel and cancel():
                    finish = FinishReason.CANCELLED
                    break
                seen = None
                if sampling.top_logprobs is not None:  # before sampling moves anything
                    seen = held if held is not None else self.ctx.logits()
                if held is not None:
                    token, held = sampler.sample_logits(held), None
                else:
                    token = sampler.sample(self.ctx)
                if ttft_ms is None:
                    ttft_ms = (time.perf_counter() - started) * 1000.0
                if self.model.is_eog(token):
                    finish = FinishReason.STOP
                    break
                tokens.append(token)
                if seen is not None and sampling.top_logprobs is not None:
                    logprobs.append(self._logprob(seen, token, sampling.top_logprobs))
                piece = decoder.decode(self.model.token_bytes(token, special=token in markers))
                pieces.append(piece)
                if on_token:
                    on_token(token, piece)
                if len(tokens) >= max_tokens:
                    break
                if len(self._live) + 1 >= self.n_ctx:
                    finish = FinishReason.CONTEXT_FULL
                    break
                if len(tokens) == 1:  # the first token is out; the cache is about to move
                    self._before_reply_decode()
                # One token per decode; cancellation is checked between tokens, so the abort
                # callback stays disarmed and the cache never holds a half-decoded token.
                self._stale = True
                self.ctx.decode([token], len(self._live))
                self._live.append(token)
                self._stale = False
        finally:
            sampler.close()
            if not self.waits_for_reply():
                self.flush_capture()  # a reply that ended before its first decode
        pieces.append(decoder.decode(b"", final=True))
        return Generation(
            tokens=tuple(tokens),
            text="".join(pieces),
            finish=finish,
            ttft_ms=ttft_ms,
            decode_ms=(time.perf_counter() - started) * 1000.0,
            logprobs=tuple(logprobs),
        )

    def _logprob(self, logits: np.ndarray, token: int, top: int) -> TokenLogprob:
        """`token`'s log-probability under `logits` and the `top` likeliest tokens'."""
        values = logits.astype(np.float64)
        peak = values.max()
        normal = values - (peak + np.log(np.exp(values - peak).sum()))
        best: list[int] = []
        if top > 0:
            count = min(top, normal.shape[0])
            picked = np.argpartition(-normal, count - 1)[:count]
            best = [int(i) for i in picked[np.argsort(-normal[picked], kind="stable")]]

        def named(t: int) -> tuple[str, bytes]:
            data = self.model.token_bytes(t)
            return data.decode("utf-8", errors="replace"), data

        text, data = named(token)
        return TokenLogprob(text, data, float(normal[token]),
                            tuple((*named(t), float(normal[t])) for t in best))

    def last_logits(self) -> np.ndarray:
        """The logits the next token is sampled from: the last decoded token's, or those
        kept for a prompt prepared without a decode (for tests of the invariant)."""
        if self._stale:
            held = self._logits_at(len(self._live))
            if held is None:
                raise RuntimeError("no logits for the last live token")
            return held.copy()
        return self.ctx.logits()


def _llama_cpp_version() -> str:
    from importlib import metadata

    return metadata.version("llama-cpp-python")


