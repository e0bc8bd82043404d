"""The one llama.cpp context: prepare a prompt with the least decoding, then generate.

`Runtime.prepare(target, marks=...)` brings the context to hold exactly `target`, reusing what
the live cache or a checkpoint holds where that is valid for the model's memory kind
(docs/architecture.md, "Preparing a prompt"), and decoding the rest in the chunks of the
target's decode schedule (`engine.core.schedule`): the same chunks whatever was reused, so the
result never depends on what the cache did. `Runtime.generate()` then samples token by token.
Both honour a cancel check: between chunks, inside a chunk (llama.cpp's abort callback) and
between tokens, and both leave `live_tokens` equal to what the cache really holds.
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
from engine.core.errors import ArborError, Cancelled, ContextOverflowError, DecodeError
from engine.core.memory import MemoryKind
from engine.core.prefix import common_prefix
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
from engine.core.schedule import CPU_GRID, GPU_GRID, Schedule, decode_schedule
from engine.llm.llama import LlamaContext, LlamaModel, Sampler, SamplingParams, gpu_memory
from engine.llm.placement import place
from engine.models.files import file_sha256
from engine.models.fit import GpuMemory
from engine.storage.checkpoints import PARTIAL_ONLY, Checkpoint, Identity

log = logging.getLogger(__name__)

STATE_FLAGS = 0  # whole per-sequence state: the only kind safe for every memory kind
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


class Runtime:
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
        params = self.ctx.params
        self.memory_kind = self.model.memory_kind()
        self.n_swa = self.model.n_swa
        self.n_ctx = self.ctx.n_ctx
        self.n_batch = params.n_batch
        # Chunk ends on a grid inside long messages: where an edit restarts, and where
        # recurrent checkpoints (every RECURRENT_INTERVAL) sit.
        self.grid = min(self.n_batch, CPU_GRID if gpu is None else GPU_GRID)
        self._live: list[int] = []
        # The chunk ends the live prefix was decoded with: the state up to _bounds[-1] is
        # exactly what that schedule gives. Tokens after it came from one-token decodes.
        self._bounds: list[int] = []
        # A sliding-window cache (swa_full off) reuses the cells of positions that left the
        # window, so where the next tokens land depends on the cache's history, and the
        # attention sums run in cell order: on K-quants that changes the logits (by more than
        # 1 on Gemma 3 270M). Every interior chunk end is therefore settled: the state is
        # saved and loaded back, which lays it out from cell 0 the same way whatever came
        # before, in every mode. `_settled` says the live state is in that form now. Only
        # the window layers' cells need it: the other layers' cache is filled from cell 0 in
        # position order in every mode, so a settle saves and loads back the window part
        # alone (a partial state, below) unless the whole state is wanted as a checkpoint.
        self._settles = self.memory_kind is MemoryKind.SLIDING_WINDOW
        # Partial states (PARTIAL_ONLY): the part of the state that cannot be cut back, the
        # recurrent part of a hybrid whose attention layers see the whole context or the
        # window layers' cache of a sliding-window model. The rest is a cache that is cut
        # back as a dense one is, so a partial checkpoint restores the live state to its
        # prefix: load it over the live state, then cut the rest back. On the hybrid bench
        # model at 8k tokens it is 0.3 MB in 0.1 ms, where the whole state is 33 MB in 20 ms.
        self.partial_states = self._settles or (
            self.memory_kind is MemoryKind.HYBRID and self.n_swa == 0)
        self._settled = False
        self._scratch: bytearray | None = None  # where settles that keep nothing save
        # A saved state of the first n live tokens, (n, blob, size, flags): what brings a
        # cache that cannot roll an aborted chunk back (recurrent, hybrid, window) back to
        # the live prefix, so a pre-empted warm-up keeps what it decoded. A settle's or a
        # restore's blob where there is one, else captured into `_rescue_buf` before each
        # chunk that can be aborted (a hybrid's recurrent part: 0.1 ms).
        self._rescue: tuple[int, bytes | bytearray, int, int] | None = None
        self._rescue_buf: bytearray | None = None
        # Whose requests the live state was prepared for (engine.storage.checkpoints: scopes): only
        # a prepare for the same scope reuses it, and its checkpoints carry it.
        self._live_scope = ""
        # The prompt-end checkpoint, taken after the first token is sampled (see prepare):
        # the length it must be taken at, and who keeps it.
        self._pending_capture: tuple[int, Callable[[Checkpoint], None], bool] | None = None
        # The logits after the first n live tokens, a prompt's end (n, logits): kept while
        # those tokens are live, so a target ending there needs no decode (saved state
        # holds no logits; the checkpoint taken there keeps them beside its blob).
        self._end: tuple[int, np.ndarray] | None = None
        # Whether llama.cpp's output no longer holds the last live token's logits (after a
        # restore or a cut with nothing decoded since): the first token then comes from
        # `_end` (Sampler.sample_logits).
        self._stale = True
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

    # --- the live cache ----------------------------------------------------------------

    @property
    def live_tokens(self) -> tuple[int, ...]:
        """The tokens the context holds, positions 0..n-1."""
        return tuple(self._live)

    @property
    def canonical_tokens(self) -> int:
        """How many leading live tokens hold exactly the state their decode schedule gives.

        Tokens decoded one at a time during generation take llama.cpp's single-token
        kernels, whose results differ from a batched decode of the same tokens (on
        SmolLM2 Q4_1, by up to 0.46 in the logits after 64 tokens). Reusing them would
        break the invariant, so they are decoded again, in the next prompt's chunks.
        """
        return self._bounds[-1] if self._bounds else 0

    @property
    def live_scope(self) -> str:
        """The cache scope the live state was prepared for."""
        return self._live_scope

    @property
    def live_bounds(self) -> tuple[int, ...]:
        """The chunk ends the canonical live prefix was decoded with."""
        return tuple(self._bounds)

    def schedule(self, length: int, marks: Iterable[int] = ()) -> Schedule:
        """The decode schedule of a target of `length` tokens with these marks."""
        return decode_schedule(length, n_batch=self.n_batch, grid=self.grid, marks=marks)

    def clear(self) -> None:
        self.flush_capture()
        self.ctx.clear()
        self._live = []
        self._bounds = []
        self._settled = False
        self._rescue = None
        self._end = None
        self._stale = True

    def _logits_at(self, n: int) -> np.ndarray | None:
        """The kept logits after the first `n` live tokens, if `n` is where they were kept."""
        if self._end is None or self._end[0] != n or n > self.canonical_tokens:
            return None
        return self._end[1]

    def live_reuse(self, target: Sequence[int], schedule: Schedule | None = None) -> int:
        """How many leading tokens of `target` the live cache can keep, for this memory kind.

        Only a chunk end of the target's schedule that the live prefix was decoded up to
        with the same chunk ends qualifies; the target's own end only where the logits of
        its last token were kept (`_end`): else its last chunk is decoded for them. The
        answer never comes from `seq_rm`'s return value: it comes from the memory kind and
        the positions llama.cpp reports.
        """
        schedule = schedule or self.schedule(len(target))
        usable = [end for end in self._canonical_ends(target, schedule)
                  if end < len(target) or self._logits_at(end) is not None]
        if not usable:
            return 0
        if self.memory_kind is not MemoryKind.DENSE:
            # Recurrent and hybrid state cannot be cut back; a sliding-window cache cut back
            # would place the next tokens in other cells than a fresh decode (see
            # `_settles`). Usable only if all of it is canonical and a chunk end of the target.
            n = len(self._live)
            return n if usable[-1] == n else 0
        reuse = usable[-1]
        return reuse if self._window_holds(reuse) else 0

    def _canonical_ends(self, target: Sequence[int], schedule: Schedule) -> list[int]:
        """The chunk ends of `target`'s schedule up to which the live cache holds exactly
        the state a decode of `target` by `schedule` gives (what a cut back could keep)."""
        if not self._bounds:
            return []
        common = common_prefix(self._live[: self.canonical_tokens], target)
        agreed = common_prefix(self._bounds, schedule.ends)
        return [end for end in self._bounds[:agreed] if end <= common]

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

    def capture(self, node_id: int | None = None, *, partial: bool = False) -> Checkpoint:
        """Save the state of the live tokens. Only canonical state is worth saving.
        `partial`: the recurrent part alone (`partial_states`)."""
        if self.canonical_tokens != len(self._live) or not self._live:
            raise RuntimeError("capture() needs a live cache that holds only prompt tokens")
        if partial and not self.partial_states:
            raise ValueError(f"a {self.memory_kind} model has no partial state")
        flags = PARTIAL_ONLY if partial else STATE_FLAGS
        blob = self.ctx.state_get(flags)
        logits = self._logits_at(len(self._live))
        return Checkpoint(
            tokens=tuple(self._live), blob=blob, bounds=tuple(self._bounds), flags=flags,
            node_id=node_id, scope=self._live_scope,
            logits=logits.astype("<f4", copy=False).tobytes() if logits is not None else None,
        )

    def restore(self, checkpoint: Checkpoint) -> bool:
        """Load a checkpoint and verify it. On any failure the sequence is cleared."""
        if checkpoint.partial:
            return self._restore_partial(checkpoint)
        self.flush_capture()
        self.clear()
        problem = self._load_and_verify(checkpoint)
        if problem is not None:
            log.warning("checkpoint %d %s; dropping it", checkpoint.id, problem)
            self.clear()
            return False
        self._live = list(checkpoint.tokens)
        self._bounds = list(checkpoint.bounds)
        self._live_scope = checkpoint.scope
        self._settled = True  # loaded into a cleared cache: laid out from cell 0
        self._keep_rescue(checkpoint)
        if checkpoint.logits is not None:
            logits = np.frombuffer(checkpoint.logits, dtype="<f4")  # a read-only view
            self._end = (checkpoint.n_tokens, logits)
        return True

    def _restore_partial(self, checkpoint: Checkpoint) -> bool:
        """Bring the live state back to a partial checkpoint's prefix: load its recurrent
        part, then cut the attention cache back to it. Only where the live cache holds that
        prefix decoded with the same chunk ends (else False, nothing touched); on a failure
        after that the sequence is cleared."""
        self.flush_capture()
        n = checkpoint.n_tokens
        if not (
            self.partial_states and checkpoint.blob is not None
            and checkpoint.scope == self._live_scope
            and n <= self.canonical_tokens and tuple(self._live[:n]) == checkpoint.tokens
            and tuple(self._bounds[: len(checkpoint.bounds)]) == checkpoint.bounds
        ):
            return False
        if checkpoint.logits is not None and len(checkpoint.logits) != 4 * self.model.n_vocab:
            problem: str | None = f"has {len(checkpoint.logits)} bytes of logits"
        elif (read := self.ctx.state_set(checkpoint.blob, checkpoint.flags)) != checkpoint.size:
            problem = f"was read as {read} of {checkpoint.size} bytes"
        elif not self.ctx.seq_rm(n, -1):
            problem = f"left an attention cache that would not be cut back to {n}"
        else:
            problem = self._placed(n)
        if problem is not None:
            log.warning("partial checkpoint %d %s; dropping it", checkpoint.id, problem)
            self.clear()
            return False
        del self._live[n:]
        self._bounds = list(checkpoint.bounds)
        self._settled = True  # the window's cells loaded from 0, the rest cut back in order
        self._keep_rescue(checkpoint)
        self._stale = True
        self._end = None
        if checkpoint.logits is not None:
            self._end = (n, np.frombuffer(checkpoint.logits, dtype="<f4"))
        return True

    def _load_and_verify(self, checkpoint: Checkpoint) -> str | None:
        """Hand the blob to llama.cpp and check the result; the problem, or None."""
        if checkpoint.blob is None:
            return "has no state loaded"
        if not checkpoint.bounds or checkpoint.bounds[-1] != checkpoint.n_tokens:
            return "was decoded with an unknown schedule"
        if checkpoint.logits is not None and len(checkpoint.logits) != 4 * self.model.n_vocab:
            return f"has {len(checkpoint.logits)} bytes of logits for {self.model.n_vocab} tokens"
        read = self.ctx.state_set(checkpoint.blob, checkpoint.flags)
        if read != checkpoint.size:
            return f"was read as {read} of {checkpoint.size} bytes"
        return self._placed(checkpoint.n_tokens)

    def _placed(self, n: int) -> str | None:
        """What is wrong with the context as the state of `n` tokens just loaded, or None."""
        pos_max = self.ctx.pos_max()
        if pos_max != n - 1:
            return f"restored to position {pos_max}, expected {n - 1}"
        if not self._window_holds(n):
            return "lacks the tokens the next ones attend to"
        return None

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
        one; else the whole state).

        `scope` is whose request this is (engine.storage.checkpoints): the live cache is a candidate
        only if it was prepared for the same scope, a checkpoint only if it was made for it.
        So what is reused never depends on another scope's requests.

        A checkpoint asked for at the very end of the target is taken later, by
        `flush_capture`: `generate` calls it once the first token is sampled (sampling reads
        the logits and leaves the cache as it is), so copying the cache costs no time to the
        first token. Anything that changes the context flushes it first.
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
            plans.append((self.live_reuse(target, schedule), 1, None))
            held = max(self._canonical_ends(target, schedule), default=0)
        for checkpoint in checkpoints:
            if (checkpoint.scope == scope and checkpoint.fits(target, schedule)
                    and (not checkpoint.partial or checkpoint.n_tokens <= held)):
                plans.append((checkpoint.n_tokens, 0, checkpoint))
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
        self._decode_tail(target, schedule.chunks(reuse), saves, on_checkpoint, on_progress,
                          cancel)
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

    def _keep_live_prefix(self, reuse: int) -> int:
        """Cut the live cache back to `reuse` tokens and check that it really holds them."""
        if reuse < len(self._live):
            if not self.ctx.seq_rm(reuse, -1):
                log.info("seq_rm(%d) refused; decoding from scratch", reuse)
                self.clear()
                return 0
            self._stale = True  # the output held a later token's logits
        del self._live[reuse:]
        self._bounds = [end for end in self._bounds if end <= reuse]
        if self._end is not None and self._end[0] > reuse:
            self._end = None
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
        ends: list[int],
        saves: dict[int, bool],
        on_checkpoint: Callable[[Checkpoint], None] | None,
        on_progress: ProgressFn | None,
        cancel: CancelFn | None,
    ) -> None:
        """Decode the chunks ending at `ends`, from where the live prefix ends, capturing
        the state at the chunk ends in `saves` (a partial state where it says True)."""
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
                        self._pending_capture = (end, keep, partial)
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

    def _settle(self, *, partial: bool) -> Checkpoint:
        """Save the live state and load it back (see `_settles`): the whole state into the
        cleared cache, or (`partial`) the window layers' part over the live state, which
        lays those cells out from 0 as the whole load does (llama.cpp frees the sequence's
        cells there first) and leaves the other layers' cache as it is. The state saved is
        returned as a checkpoint."""
        checkpoint = self.capture(partial=partial)
        if partial:
            read = self.ctx.state_set(checkpoint.blob or b"", checkpoint.flags)
            self._check_settle(read, checkpoint.size)
        else:
            self.ctx.clear()
            self._check_settle(None, 0, self._load_and_verify(checkpoint))
        self._keep_rescue(checkpoint)
        return checkpoint

    def _settle_window(self) -> None:
        """A partial settle whose state nobody keeps: saved into a scratch buffer the runtime
        reuses. A fresh buffer is what a save costs most on a VM (its pages are faulted in:
        on Gemma 3 270M at 8k tokens ~20 ms for the window's 16 MB, against ~1 ms to load it
        back), and six of a 300-token turn's eight settles keep nothing."""
        self._scratch, size = self.ctx.state_into(self._scratch, PARTIAL_ONLY)
        self._check_settle(self.ctx.state_set(self._scratch, PARTIAL_ONLY, size=size), size)
        self._rescue = (len(self._live), self._scratch, size, PARTIAL_ONLY)

    def _keep_rescue(self, checkpoint: Checkpoint) -> None:
        """The state just loaded or saved is the live prefix's: what an abort goes back to."""
        if checkpoint.blob is not None and checkpoint.n_tokens == len(self._live):
            self._rescue = (checkpoint.n_tokens, checkpoint.blob, checkpoint.size,
                            checkpoint.flags)

    def _save_rescue(self) -> None:
        """Before a chunk that can be aborted: make sure `_rescue` holds the live prefix."""
        n = len(self._live)
        if (self.memory_kind is MemoryKind.DENSE or n == 0 or self.canonical_tokens != n
                or (self._rescue is not None and self._rescue[0] == n)):
            return
        flags = PARTIAL_ONLY if self.partial_states else STATE_FLAGS
        self._rescue_buf, size = self.ctx.state_into(self._rescue_buf, flags)
        self._rescue = (n, self._rescue_buf, size, flags)

    def _rescued(self) -> bool:
        """After an aborted chunk: bring the cache back to the live prefix from `_rescue`."""
        n = len(self._live)
        if self._rescue is None or self._rescue[0] != n or n == 0:
            return False
        _, blob, size, flags = self._rescue
        if flags & PARTIAL_ONLY:
            ok = (self.ctx.state_set(blob, flags, size=size) == size
                  and self.ctx.seq_rm(n, -1))
        else:
            self.ctx.clear()
            ok = self.ctx.state_set(blob, flags, size=size) == size
        if not ok or self._placed(n) is not None:
            return False
        self._settled = True  # laid out as the settle or restore that saved it left it
        return True

    def _check_settle(self, read: int | None, size: int, problem: str | None = None) -> None:
        """After a settle's load: fail if llama.cpp refused its own state (a bug there)."""
        if read is not None:
            problem = (f"was read as {read} of {size} bytes" if read != size
                       else self._placed(len(self._live)))
        if problem is not None:
            self.clear()
            raise DecodeError(f"the context's own state {problem}")
        self._settled = True
        self._stale = True  # the output is not the restored state's to vouch for

    def flush_capture(self) -> None:
        """Take the deferred prompt-end checkpoint now, if one is waiting."""
        pending, self._pending_capture = self._pending_capture, None
        if pending is None:
            return
        held, keep, partial = pending
        if len(self._live) == held and self.canonical_tokens == held:
            keep(self.capture(partial=partial))
        else:  # cannot happen while every change flushes first; never save a wrong state
            log.warning("deferred checkpoint dropped: the context changed before it")

    def _before_reply_decode(self) -> None:
        """Before the first reply token is decoded: take the deferred checkpoint, and settle
        a sliding-window cache that holds exactly a prompt. A prompt's end is then settled
        in every mode, as its restored checkpoint is, so a reply decodes into the same cells
        whether the prompt was decoded, kept live or restored without a decode (on Gemma 3
        270M the unsettled and the restored cache gave replies apart at once)."""
        n = len(self._live)
        if not (self._settles and not self._settled and self.canonical_tokens == n):
            self.flush_capture()
            return
        pending, self._pending_capture = self._pending_capture, None
        if pending is not None and pending[0] == n:
            _, keep, partial = pending
            keep(self._settle(partial=partial))  # its blob is the prompt-end checkpoint
        else:
            self._settle_window()

    def _resync_after_abort(self) -> None:
        """After an aborted decode, keep the live prefix only if the cache still holds
        exactly the chunks that completed (one chunk is one ubatch, rolled back whole)."""
        self._stale = True
        if self.memory_kind is not MemoryKind.DENSE:
            # An aborted graph may have half-updated a recurrent state, and a sliding-window
            # cache may have given cells of old positions to the rolled-back chunk: back to
            # the state saved before it, or drop it all.
            if not self._rescued():
                self.clear()
            return
        if self.ctx.pos_max() + 1 != len(self._live):
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


