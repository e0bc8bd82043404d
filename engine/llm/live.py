"""What the one llama.cpp context holds, and the states saved of it.

`LiveState` keeps the live tokens, the chunk ends they were decoded with and the scope they
were prepared for; it cuts the live cache back where the memory kind allows, captures and
restores checkpoints (whole, or partial where the model has such a state), settles a
sliding-window cache and brings the cache back to its live prefix after an aborted chunk
(docs/architecture.md, "Preparing a prompt"). `engine.llm.runtime.Runtime` builds on it to
prepare prompts and generate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.core.errors import DecodeError
from engine.core.memory import MemoryKind
from engine.core.prefix import common_prefix
from engine.core.schedule import Schedule, decode_schedule
from engine.llm.llama import LlamaContext, LlamaModel
from engine.storage.checkpoints import PARTIAL_ONLY, Checkpoint
from engine.storage.placement import inner_span

log = logging.getLogger(__name__)

STATE_FLAGS = 0  # whole per-sequence state: the only kind safe for every memory kind


@dataclass(frozen=True)
class PendingCapture:
    """The prompt-end checkpoint `prepare` asked for, taken once the first token is sampled:
    at `n` live tokens, for `keep`; a partial state (`partial`), or the whole state and
    (`twin`) a partial one beside it. `base`: that partial twin, taken already; the whole
    state waits until the reply is over, when the twin and the attention cache cut back
    rebuild the prompt's state (`LiveState.flush_capture`)."""

    n: int
    keep: Callable[[Checkpoint], None]
    partial: bool = False
    twin: bool = False
    base: Checkpoint | None = None


@dataclass(frozen=True)
class SavedState:
    """A state saved of the first `n` live tokens: `size` bytes of `blob` (a buffer that
    may be reused), saved with llama.cpp's state `flags`."""

    n: int
    blob: bytes | bytearray
    size: int
    flags: int

    @property
    def partial(self) -> bool:
        return bool(self.flags & PARTIAL_ONLY)


class LiveState:
    """The live cache of one context and the states saved of it. Not thread-safe."""

    def __init__(self, ctx: LlamaContext, model: LlamaModel, *, grid: int) -> None:
        self.ctx, self.model = ctx, model
        self.memory_kind = model.memory_kind()
        self.n_swa = model.n_swa
        self.n_ctx = ctx.n_ctx
        self.n_batch = ctx.params.n_batch
        # Chunk ends on a grid inside long messages: where an edit restarts, and where
        # recurrent checkpoints (every RECURRENT_INTERVAL) sit.
        self.grid = grid
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
        # A hybrid's partial state is its recurrent part, small whatever the context (0.3 MB
        # on the bench model); a window model's is its window cache (16 MB on Gemma 3 270M).
        self.cheap_partials = self.partial_states and self.memory_kind is MemoryKind.HYBRID
        # The grid only inside stretches that get inner checkpoints, where the cache cannot
        # be cut back to a chunk end (engine.core.schedule).
        self.long_run = 0 if self.memory_kind is MemoryKind.DENSE else inner_span(grid)
        self._settled = False
        self._scratch: bytearray | None = None  # where settles that keep nothing save
        # A saved state of the live prefix: what brings a cache that cannot roll an aborted
        # chunk back (recurrent, hybrid, window) back to the live prefix, so a pre-empted
        # warm-up keeps what it decoded. A settle's or a restore's blob where there is one,
        # else captured into `_rescue_buf` before each chunk that can be aborted (a hybrid's
        # recurrent part: 0.1 ms).
        self._rescue: SavedState | None = None
        self._rescue_buf: bytearray | None = None
        # Whose requests the live state was prepared for (engine.storage.checkpoints: scopes):
        # only a prepare for the same scope reuses it, and its checkpoints carry it.
        self._live_scope = ""
        # The prompt-end checkpoint, taken after the first token is sampled (see prepare).
        self._pending_capture: PendingCapture | None = None
        # The logits after the first n live tokens, a prompt's end (n, logits): kept while
        # those tokens are live, so a target ending there needs no decode (saved state
        # holds no logits; the checkpoint taken there keeps them beside its blob).
        self._end: tuple[int, np.ndarray] | None = None
        # Whether llama.cpp's output no longer holds the last live token's logits (after a
        # restore or a cut with nothing decoded since): the first token then comes from
        # `_end` (Sampler.sample_logits).
        self._stale = True

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
        return decode_schedule(length, n_batch=self.n_batch, grid=self.grid, marks=marks,
                               long_run=self.long_run)

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

    def _adopt_logits(self, n: int, checkpoints: Iterable[Checkpoint]) -> None:
        """A dense cache that holds the first `n` live tokens canonically, without their
        logits (a warm-up decoded on past them): keep the logits of a checkpoint of that
        very state, so a cut back serves where loading its blob would copy the whole cache
        (0.4 GB at 16k tokens on SmolLM2). Other kinds restore it (or its partial twin)."""
        if self.memory_kind is not MemoryKind.DENSE or self._logits_at(n) is not None:
            return
        for checkpoint in checkpoints:
            if (checkpoint.n_tokens == n and checkpoint.logits is not None
                    and self._logits_fit(checkpoint) and self._holds(checkpoint)):
                self._end = (n, np.frombuffer(checkpoint.logits, dtype="<f4"))
                return

    def _holds(self, checkpoint: Checkpoint) -> bool:
        """Whether the live cache holds `checkpoint`'s prefix canonically, decoded with the
        same chunk ends, in the same scope."""
        n = checkpoint.n_tokens
        return (checkpoint.scope == self._live_scope and n <= self.canonical_tokens
                and tuple(self._live[:n]) == checkpoint.tokens
                and tuple(self._bounds[: len(checkpoint.bounds)]) == checkpoint.bounds)

    def _logits_fit(self, checkpoint: Checkpoint) -> bool:
        """Whether `checkpoint`'s kept logits, if any, are one float32 per vocabulary token."""
        return checkpoint.logits is None or len(checkpoint.logits) == 4 * self.model.n_vocab

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
        if not (self.partial_states and checkpoint.blob is not None and self._holds(checkpoint)):
            return False
        if not self._logits_fit(checkpoint):
            problem: str | None = f"has {len(checkpoint.logits or b'')} bytes of logits"
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
        if not self._logits_fit(checkpoint):
            return f"has {len(checkpoint.logits or b'')} bytes of logits for " \
                f"{self.model.n_vocab} tokens"
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


    # --- settles and rescues ----------------------------------------------------------

    def _settle(self, *, partial: bool) -> Checkpoint:
        """Save the live state and load it back (see `_settles`): the whole state into the
        cleared cache, or (`partial`) the window layers' part over the live state, which
        lays those cells out from 0 as the whole load does (llama.cpp frees the sequence's
        cells there first) and leaves the other layers' cache as it is. The state saved is
        returned as a checkpoint."""
        checkpoint = self.capture(partial=partial)
        if partial:
            read = self.ctx.state_set(checkpoint.blob or b"", checkpoint.flags)
            self._settled_back(self._read_back(read, checkpoint.size))
        else:
            self.ctx.clear()
            self._settled_back(self._load_and_verify(checkpoint))
        self._keep_rescue(checkpoint)
        return checkpoint

    def _settle_window(self) -> None:
        """A partial settle whose state nobody keeps: saved into a scratch buffer the runtime
        reuses. A fresh buffer is what a save costs most on a VM (its pages are faulted in:
        on Gemma 3 270M at 8k tokens ~20 ms for the window's 16 MB, against ~1 ms to load it
        back), and six of a 300-token turn's eight settles keep nothing."""
        self._scratch, size = self.ctx.state_into(self._scratch, PARTIAL_ONLY)
        read = self.ctx.state_set(self._scratch, PARTIAL_ONLY, size=size)
        self._settled_back(self._read_back(read, size))
        self._rescue = SavedState(len(self._live), self._scratch, size, PARTIAL_ONLY)

    def _keep_rescue(self, checkpoint: Checkpoint) -> None:
        """The state just loaded or saved is the live prefix's: what an abort goes back to."""
        if checkpoint.blob is not None and checkpoint.n_tokens == len(self._live):
            self._rescue = SavedState(checkpoint.n_tokens, checkpoint.blob, checkpoint.size,
                                      checkpoint.flags)

    def _save_rescue(self) -> None:
        """Before a chunk that can be aborted: make sure `_rescue` holds the live prefix."""
        n = len(self._live)
        if (self.memory_kind is MemoryKind.DENSE or n == 0 or self.canonical_tokens != n
                or (self._rescue is not None and self._rescue.n == n)):
            return
        flags = PARTIAL_ONLY if self.partial_states else STATE_FLAGS
        self._rescue_buf, size = self.ctx.state_into(self._rescue_buf, flags)
        self._rescue = SavedState(n, self._rescue_buf, size, flags)

    def _rescued(self) -> bool:
        """After an aborted chunk: bring the cache back to the live prefix from `_rescue`."""
        n = len(self._live)
        saved = self._rescue
        if saved is None or saved.n != n or n == 0:
            return False
        if saved.partial:
            ok = (self.ctx.state_set(saved.blob, saved.flags, size=saved.size) == saved.size
                  and self.ctx.seq_rm(n, -1))
        else:
            self.ctx.clear()
            ok = self.ctx.state_set(saved.blob, saved.flags, size=saved.size) == saved.size
        if not ok or self._placed(n) is not None:
            return False
        self._settled = True  # laid out as the settle or restore that saved it left it
        return True

    def _read_back(self, read: int, size: int) -> str | None:
        """What is wrong after a settle loaded back `read` of the `size` bytes it saved."""
        if read != size:
            return f"was read as {read} of {size} bytes"
        return self._placed(len(self._live))

    def _settled_back(self, problem: str | None) -> None:
        """After a settle's load: fail if llama.cpp refused its own state (a bug there)."""
        if problem is not None:
            self.clear()
            raise DecodeError(f"the context's own state {problem}")
        self._settled = True
        self._stale = True  # the output is not the restored state's to vouch for

    @property
    def captures_after_reply(self) -> bool:
        """Whether the prompt-end checkpoint waits until the reply is over (`flush_capture`):
        on a dense cache, where the reply's tokens take cells of their own and cutting them
        off gives back exactly the prompt's state. There the capture is the whole KV cache
        (0.38 GB and 0.58 s at 16k tokens on SmolLM2), which would otherwise hold up the
        reply's second token; after the reply it runs while the user reads, and the reply's
        tokens it cuts off were decoded one at a time, which no later prompt reuses."""
        return self.memory_kind is MemoryKind.DENSE

    def waits_for_reply(self) -> bool:
        """Whether the prompt-end capture waiting now is left until the reply is over: on a
        dense cache (`captures_after_reply`), or a hybrid's whole state once its partial
        twin is taken (`PendingCapture.base`)."""
        pending = self._pending_capture
        return pending is not None and (self.captures_after_reply or pending.base is not None)

    def flush_capture(self) -> None:
        """Take the deferred prompt-end checkpoint now, if one is waiting. After a reply,
        the prompt's state is rebuilt first: on a dense cache by cutting the reply off
        (`captures_after_reply`), on a hybrid by loading the partial twin taken at the first
        token and cutting the attention cache back (`PendingCapture.base`); the reply's
        one-token decodes are never reused anyway."""
        pending, self._pending_capture = self._pending_capture, None
        if pending is None:
            return
        n = pending.n
        if pending.base is not None:
            rebuilt = self._restore_partial(pending.base)
        elif len(self._live) > n:  # a reply's tokens follow the prompt
            rebuilt = (self.captures_after_reply and self.canonical_tokens == n
                       and self._keep_live_prefix(n) == n)
        else:
            rebuilt = True  # the live cache holds exactly the prompt
        if not rebuilt:
            log.warning("deferred checkpoint dropped: the prompt's state was not rebuilt")
            return
        if len(self._live) == pending.n and self.canonical_tokens == pending.n:
            pending.keep(self.capture(partial=pending.partial))
            if pending.twin:
                pending.keep(self.capture(partial=True))
        else:  # cannot happen while every change flushes first; never save a wrong state
            log.warning("deferred checkpoint dropped: the context changed before it")

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

