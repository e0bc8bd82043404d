"""Partial states: the recurrent part of a hybrid's state, or the window layers' cache of a
sliding-window model, alone. A partial checkpoint is restored over the live state, the rest
cut back to it: exact where the live cache holds its prefix, never used where it does not. A
sliding-window model settles only its window part between chunks."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.bench.random_models import Quant
from engine.core.errors import Cancelled
from engine.core.memory import MemoryKind
from engine.core.results import Source
from engine.core.tree import Role, Tree
from engine.llm.generator import Generator
from engine.llm.llama import SamplingParams
from engine.llm.runtime import Runtime
from engine.storage.checkpoints import Checkpoint, CheckpointStore
from tests.conftest import ALL_KINDS, RuntimeFactory
from tests.helpers import InsideSecondChunk, fresh_logits, random_tokens

GREEDY = SamplingParams(temperature=0.0)
MARKS = [64, 128]  # two messages end there


def _decode_and_capture(
    runtime: Runtime, first: list[int], at: int
) -> tuple[Checkpoint, Checkpoint]:
    """Decode `first`, capturing the whole and the partial state after `at` tokens."""
    runtime.prepare(first[:at], marks=MARKS)
    whole, partial = runtime.capture(), runtime.capture(partial=True)
    runtime.prepare(first, marks=MARKS)
    return whole, partial


PARTIAL_KINDS = [MemoryKind.HYBRID, MemoryKind.SLIDING_WINDOW]


@pytest.mark.parametrize("quant", [Quant.F32, Quant.Q8_0, Quant.Q4_K_M], ids=str)
@pytest.mark.parametrize("kind", PARTIAL_KINDS, ids=lambda k: k.value)
def test_a_partial_checkpoint_restores_the_live_branch_exactly(
    kind: MemoryKind, quant: Quant, quantized_models: Callable[[MemoryKind, Quant], Path],
    make_runtime: RuntimeFactory,
) -> None:
    path = quantized_models(kind, quant)
    runtime = make_runtime(path, n_ctx=1024, n_batch=64)
    assert runtime.partial_states
    first = random_tokens(300)
    whole, partial = _decode_and_capture(runtime, first, 128)
    assert partial.partial and not whole.partial
    assert partial.size < whole.size  # the rest stays in the context

    edited = first[:128] + random_tokens(70, seed=3)  # the third message is edited
    report = runtime.prepare(edited, marks=MARKS, checkpoints=[partial])
    assert (report.source, report.reused_tokens, report.checkpoint_id) == (
        Source.CHECKPOINT, 128, partial.id)
    assert runtime.live_tokens == tuple(edited)
    cached = runtime.last_logits()
    assert np.array_equal(cached, fresh_logits(runtime, edited, MARKS))


@pytest.mark.parametrize("kind", PARTIAL_KINDS, ids=lambda k: k.value)
def test_a_partial_checkpoint_is_never_used_once_the_live_cache_has_moved(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=64)
    first = random_tokens(300)
    whole, partial = _decode_and_capture(runtime, first, 128)
    other = first[:64] + random_tokens(200, seed=4)  # another branch, after the first message
    runtime.prepare(other, marks=MARKS)
    assert runtime.live_tokens[:128] != tuple(first[:128])

    # The live cache no longer holds the partial's prefix: restoring it refuses without
    # touching the context, and it is no candidate (nor reported as failed).
    assert runtime.restore(partial) is False
    assert runtime.live_tokens == tuple(other)
    edited = first[:128] + random_tokens(70, seed=3)
    report = runtime.prepare(edited, marks=MARKS, checkpoints=[partial])
    assert (report.reused_tokens, report.failed_checkpoints) == (0, ())
    assert np.array_equal(runtime.last_logits(), fresh_logits(runtime, edited, MARKS))

    # Another scope's live cache holds the same tokens; the partial is still no candidate.
    runtime.prepare(first, marks=MARKS, scope="api:someone")
    report = runtime.prepare(edited, marks=MARKS, checkpoints=[partial], scope="api:someone")
    assert report.reused_tokens == 0
    # With a whole checkpoint beside it, that one is used.
    runtime.prepare(other, marks=MARKS)
    report = runtime.prepare(edited, marks=MARKS, checkpoints=[partial, whole])
    assert (report.source, report.checkpoint_id) == (Source.CHECKPOINT, whole.id)


@pytest.mark.parametrize("kind", PARTIAL_KINDS, ids=lambda k: k.value)
def test_a_damaged_partial_checkpoint_is_dropped_and_the_next_candidate_serves(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=64)
    first = random_tokens(300)
    runtime.prepare(first[:64], marks=MARKS)
    early = runtime.capture()
    _, partial = _decode_and_capture(runtime, first, 128)
    truncated = replace(partial, blob=bytes(partial.blob or b"")[:-100], size=-1)
    edited = first[:128] + random_tokens(70, seed=3)
    report = runtime.prepare(edited, marks=MARKS, checkpoints=[truncated, early])
    # The truncated state is refused, the context cleared; the partial behind it needs the
    # live cache that is gone, the whole one at 64 serves.
    assert report.failed_checkpoints == (truncated.id,)
    assert (report.source, report.reused_tokens, report.checkpoint_id) == (
        Source.CHECKPOINT, 64, early.id)
    assert np.array_equal(runtime.last_logits(), fresh_logits(runtime, edited, MARKS))


@pytest.mark.parametrize("kind", PARTIAL_KINDS, ids=lambda k: k.value)
def test_an_aborted_chunk_keeps_the_live_prefix_and_the_partial_checkpoints_on_it(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """A warm-up pre-empted inside a chunk: the cache goes back to the state saved before
    the chunk, so the live prefix, and every partial checkpoint it holds, stay usable."""
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=64)
    first = random_tokens(300)
    _, partial = _decode_and_capture(runtime, first, 128)
    cancel = InsideSecondChunk()
    extended, marks = first + random_tokens(200, seed=5), [*MARKS, 300]
    with pytest.raises(Cancelled):
        runtime.prepare(extended, marks=marks, on_progress=cancel.progress, cancel=cancel)
    assert cancel.aborted_inside
    chunk_end = min(e for e in runtime.schedule(len(extended), marks).ends if e > 300)
    assert runtime.live_tokens == tuple(extended[:chunk_end])  # the extension's first chunk
    edited = first[:128] + random_tokens(70, seed=3)
    report = runtime.prepare(edited, marks=MARKS, checkpoints=[partial])
    assert (report.source, report.checkpoint_id) == (Source.CHECKPOINT, partial.id)
    assert np.array_equal(runtime.last_logits(), fresh_logits(runtime, edited, MARKS))


@pytest.mark.parametrize("kind", [k for k in ALL_KINDS if k not in PARTIAL_KINDS],
                         ids=lambda k: k.value)
def test_dense_and_recurrent_models_have_no_partial_state(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models[kind.value], n_ctx=512, n_batch=64)
    assert not runtime.partial_states
    runtime.prepare(random_tokens(100))
    with pytest.raises(ValueError, match="no partial state"):
        runtime.capture(partial=True)
    # Asked for partial saves, it takes whole ones.
    saved: list[Checkpoint] = []
    runtime.clear()
    runtime.prepare(random_tokens(130), marks=[64], save_at=[64], partial_at=[64],
                    on_checkpoint=saved.append)
    assert [(c.n_tokens, c.partial) for c in saved] == [(64, False)]


@pytest.mark.parametrize("kind", PARTIAL_KINDS, ids=lambda k: k.value)
def test_a_chat_keeps_message_ends_partial_and_answers_as_a_full_reprocess(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """Message ends are saved partial, the prompt's end whole (on the hybrid with a partial
    twin); a swipe restores the twin, a new turn and an edit a few turns back the partial
    states of the live branch, a return to the first branch the whole prompt-end state;
    every answer is the full reprocess's."""
    runtime = make_runtime(tiny_models[kind.value], n_ctx=2048, n_batch=16)
    store = CheckpointStore(runtime.identity())
    generator = Generator(runtime, sampling=GREEDY, checkpoints=store)
    cold = Generator(make_runtime(tiny_models[kind.value], n_ctx=2048, n_batch=16),
                     sampling=GREEDY, use_cache=False)
    tree = Tree("You are terse.")
    parent = tree.root.id
    users = []
    for turn in range(4):
        user = tree.add_child(parent, Role.USER, f"Question {turn}: tell me of rivers.")
        users.append(user)
        path = tree.path_to(user.id)
        report = generator.prepare(path).report
        if turn > 0:  # the previous prompt's end: restored whole, or on the hybrid rebuilt
            # from its partial twin when its whole state was taken after the reply
            assert report.source is (
                Source.LIVE if kind is MemoryKind.HYBRID else Source.CHECKPOINT)
        generation = generator.generate(max_tokens=5, seed=turn)
        reply = tree.add_child(user.id, Role.ASSISTANT, generation.text)
        reply.tokens = generator.reply_tokens(path, generation.tokens, generation.text).tokens
        parent = reply.id
    runtime.flush_capture()
    path = tree.path_to(parent)
    ends = list(itertools.accumulate(len(node.tokens or ()) for node in path))
    kept: dict[int, set[bool]] = {}
    for checkpoint in store.all():
        kept.setdefault(checkpoint.n_tokens, set()).add(checkpoint.partial)
    reply_ends = [ends[i] for i, node in enumerate(path) if node.role is Role.ASSISTANT]
    assert all(kept[n] == {True} for n in reply_ends[:-1])
    prompt_ends = sorted({c.n_tokens for c in store.all() if c.has_logits})
    twins = {False, True} if kind is MemoryKind.HYBRID else {False}
    assert prompt_ends and all(kept[n] == twins for n in prompt_ends)

    # A swipe of the last reply after a warm-up decoded it in one batch: its prompt's end, the
    # partial twin on the hybrid (the live cache holds the prompt), without a decode.
    assert generator.warm(path) is not None
    report = generator.prepare(tree.path_to(users[-1].id)).report
    used = next(c for c in store.all() if c.id == report.checkpoint_id)
    assert (report.source, report.decoded_tokens) == (Source.CHECKPOINT, 0)
    assert used.partial is (kind is MemoryKind.HYBRID)
    answer = generator.generate(max_tokens=6, seed=9)
    cold.prepare(tree.path_to(users[-1].id))
    assert cold.generate(max_tokens=6, seed=9).tokens == answer.tokens
    assert np.array_equal(answer_logits(generator, tree, users[-1].id),
                          answer_logits(cold, tree, users[-1].id))

    # An edit of the second question: restored from the partial state at the end of the
    # first reply, which the live cache holds.
    edited = tree.add_child(path[path.index(users[1]) - 1].id, Role.USER, "Lakes instead?")
    report = generator.prepare(tree.path_to(edited.id)).report
    reply_end = ends[path.index(users[1]) - 1]
    assert (report.source, report.reused_tokens) == (Source.CHECKPOINT, reply_end)
    answer = generator.generate(max_tokens=6, seed=7)
    cold.prepare(tree.path_to(edited.id))
    assert cold.generate(max_tokens=6, seed=7).tokens == answer.tokens

    # Back to the last question of the first branch: its whole prompt-end state serves.
    report = generator.prepare(tree.path_to(users[-1].id)).report
    assert report.source is Source.CHECKPOINT and report.decoded_tokens == 0
    answer = generator.generate(max_tokens=6, seed=8)
    cold.prepare(tree.path_to(users[-1].id))
    assert cold.generate(max_tokens=6, seed=8).tokens == answer.tokens


def answer_logits(generator: Generator, tree: Tree, node_id: int) -> np.ndarray:
    """The logits the first reply token to `node_id`'s path is sampled from."""
    generator.prepare(tree.path_to(node_id))
    return generator.runtime.last_logits()


def test_the_store_keeps_partial_states_in_ram_alone_beside_whole_ones(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory, tmp_path: Path
) -> None:
    runtime = make_runtime(tiny_models["hybrid"], n_ctx=1024, n_batch=64)
    whole, partial = _decode_and_capture(runtime, random_tokens(300), 128)
    store = CheckpointStore(runtime.identity(), key=b"k" * 32, ram_budget=0,
                            disk_dir=tmp_path)
    store.add(partial)
    store.add(whole)  # the same state, whole: kept beside the partial one
    assert sorted(c.id for c in store.all()) == sorted([whole.id, partial.id])
    store.add(replace(partial, id=partial.id + 10_000))  # the same partial state: nothing
    store.add(replace(whole, id=whole.id + 10_000))
    assert sorted(c.id for c in store.all()) == sorted([whole.id, partial.id])

    store.drop(whole.id)
    store.drop(partial.id)
    store.add(partial)
    store.enforce_budget()  # over the budget: a partial one is dropped, never spilled
    assert store.all() == [] and not list(tmp_path.rglob("*.ckpt"))
    store.add(whole)
    store.enforce_budget()  # where a whole one goes to disk
    assert len(store.all()) == 1 and len(list(tmp_path.rglob("*.ckpt"))) == 1


def test_settling_the_window_part_alone_is_settling_the_whole_state_on_gemma(
    gemma_path: Path, make_runtime: RuntimeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemma 3 270M Q4_K_M, whose window cache wraps after 512 tokens and whose K-quant
    kernels sum attention in cell order: settling the window layers' cells alone between
    chunks gives the logits the whole-state settle gave, bit for bit, and a partial
    checkpoint restored there answers as a decode from scratch."""
    runtime = make_runtime(gemma_path, n_ctx=2048, n_batch=64)
    whole = make_runtime(gemma_path, n_ctx=2048, n_batch=64)
    settle = Runtime._settle
    monkeypatch.setattr(whole, "_settle", lambda *, partial: settle(whole, partial=False))
    marks = [400, 777, 1100]
    first = random_tokens(1300)
    for each in (runtime, whole):
        each.prepare(first, marks=marks, use_live=False)
    assert np.array_equal(runtime.last_logits(), whole.last_logits())

    runtime.prepare(first[:777], marks=marks, use_live=False)
    partial = runtime.capture(partial=True)
    runtime.prepare(first, marks=marks)
    edited = first[:777] + random_tokens(200, seed=9)
    report = runtime.prepare(edited, marks=marks, checkpoints=[partial])
    assert (report.source, report.reused_tokens) == (Source.CHECKPOINT, 777)
    whole.prepare(edited, marks=marks, use_live=False)
    assert np.array_equal(runtime.last_logits(), whole.last_logits())
