"""Checkpoints on real llama.cpp: placement, search, verified restore, the store, faults.

Many tests here are the bugs of the ik_llama.cpp server's checkpoint change, the design this
project grew from, one test each.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.memory import MemoryKind
from engine.core.prefix import packed
from engine.core.schedule import decode_schedule
from engine.core.tree import Role, Tree
from engine.files.strict_json import dumps_strict
from engine.llm.generator import Generator
from engine.llm.llama import SamplingParams
from engine.llm.runtime import Runtime, Source
from engine.service.session import GenerationOptions, Session
from engine.storage import checkpoints as checkpoints_module
from engine.storage.checkpoints import (
    Checkpoint,
    CheckpointStore,
    Identity,
    file_head,
)
from tests.conftest import ALL_KINDS, RuntimeFactory
from tests.helpers import fresh_logits, random_tokens

GREEDY = SamplingParams(temperature=0.0)
KEY = b"the test installation's key: 32b"


def _assert_same_as_full_decode(
    runtime: Runtime, target: list[int], marks: list[int] | None = None
) -> None:
    """Bit-identical on every memory kind. A sliding-window cache (swa_full off) restored
    into other cells than a fresh decode used would sum attention in another order; every
    mode settles it at each chunk end (Runtime._settles), so there is no such difference."""
    restored = runtime.last_logits()
    fresh = fresh_logits(runtime, target, marks or [])
    assert np.array_equal(restored, fresh)


def _capture_at(runtime: Runtime, stream: list[int], *counts: int) -> list[Checkpoint]:
    """Decode `stream` from scratch, with message ends at `counts`, and capture the state
    there."""
    saved: list[Checkpoint] = []
    runtime.clear()
    runtime.prepare(stream, marks=counts, use_live=False, save_at=counts,
                    on_checkpoint=saved.append)
    assert [c.n_tokens for c in saved] == sorted(counts)
    return saved


def _identity(**changes: object) -> Identity:
    base = Identity(
        model_sha256="a" * 64, llama_cpp_python="0.3.36", n_ctx=1024, n_batch=64,
        type_k="f16", type_v="f16", flash_attn="off", swa_full=False,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


# --- placement -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_restore_resumes_at_pos_max_plus_one_with_bit_identical_logits(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=64)
    stream = random_tokens(300)
    (checkpoint,) = _capture_at(runtime, stream, 200)
    runtime.clear()
    target = stream[:260]
    report = runtime.prepare(target, marks=[200], checkpoints=[checkpoint])
    assert report.source is Source.CHECKPOINT and report.checkpoint_pos == 199
    assert (report.reused_tokens, report.decoded_tokens) == (200, 60)
    # Re-decoding position 199 would double-count it in a recurrent state: logits would differ.
    _assert_same_as_full_decode(runtime, target, [200])


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_search_takes_the_deepest_checkpoint_that_ends_before_the_divergence(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=64)
    stream = random_tokens(320)
    marks = [100, 200, 300]
    saved = _capture_at(runtime, stream, *marks)
    runtime.clear()
    # Diverges at 250: the newest (300) extends past the divergence and must not be used.
    target = stream[:250] + random_tokens(30, seed=4)
    report = runtime.prepare(target, marks=marks, checkpoints=saved)
    assert (report.source, report.checkpoint_pos) == (Source.CHECKPOINT, 199)
    _assert_same_as_full_decode(runtime, target, marks)
    # A target that ends at a checkpoint taken inside a prompt cannot use it (saved state
    # has no logits, and none were kept there): the one before it is taken instead.
    runtime.clear()
    report = runtime.prepare(stream[:200], marks=marks, checkpoints=saved)
    assert (report.checkpoint_pos, report.decoded_tokens) == (99, 100)
    # One token past it is a one-token last chunk, for the full reprocess too.
    runtime.clear()
    report = runtime.prepare(stream[:201], marks=marks, checkpoints=saved)
    assert (report.checkpoint_pos, report.decoded_tokens) == (199, 1)
    _assert_same_as_full_decode(runtime, stream[:201], marks)


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_a_checkpoint_decoded_with_other_chunk_ends_is_never_restored(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """The same tokens split elsewhere are another state on K-quant models: a checkpoint
    is a candidate only where its chunk ends are the target's."""
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=64)
    stream = random_tokens(300)
    (at200,) = _capture_at(runtime, stream, 200)
    assert at200.bounds == (64, 128, 192, 200)
    runtime.clear()
    report = runtime.prepare(stream[:260], marks=[150, 200], checkpoints=[at200])
    assert report.source is Source.NONE and report.failed_checkpoints == ()
    report = runtime.prepare(stream[:260], checkpoints=[at200])  # no mark at 200 at all
    assert report.checkpoint_pos is None


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_a_misplaced_restore_is_caught_and_never_produces_output(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """A blob of the right size that holds another position (the PR's silent corruption)."""
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=64)
    stream = random_tokens(300)
    (real,) = _capture_at(runtime, stream, 200)
    # Says 150 tokens (decoded with the target's chunk ends), holds 200.
    liar = Checkpoint(tokens=tuple(stream[:150]), blob=real.blob, bounds=(64, 128, 150))
    runtime.clear()
    report = runtime.prepare(stream[:220], marks=[150], checkpoints=[liar])
    assert report.failed_checkpoints == (liar.id,)
    assert report.source is Source.NONE and report.reused_tokens == 0
    assert np.array_equal(runtime.last_logits(), fresh_logits(runtime, stream[:220], [150]))


def test_a_truncated_blob_is_refused_by_the_size_check_and_the_next_candidate_used(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models["recurrent"], n_ctx=1024, n_batch=64)
    stream = random_tokens(300)
    early, late = _capture_at(runtime, stream, 100, 200)
    assert late.blob is not None
    broken = replace(late, blob=bytes(late.blob[: len(late.blob) // 2]), id=late.id + 10_000)
    runtime.clear()
    marks = [100, 200]
    report = runtime.prepare(stream[:250], marks=marks, checkpoints=[broken, early])
    assert report.failed_checkpoints == (broken.id,)
    assert (report.source, report.checkpoint_pos) == (Source.CHECKPOINT, 99)
    assert np.array_equal(runtime.last_logits(), fresh_logits(runtime, stream[:250], marks))


def test_the_live_cache_wins_a_tie_and_a_deeper_checkpoint_beats_it(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models["dense"], n_ctx=1024, n_batch=64)
    stream = random_tokens(300)
    (at200,) = _capture_at(runtime, stream, 200)
    runtime.clear()
    # The live cache shares 200 tokens with the stream, and a message end there.
    runtime.prepare(stream[:200] + random_tokens(50, seed=8), marks=[200])
    report = runtime.prepare(stream[:260], marks=[200], checkpoints=[at200])
    assert report.source is Source.LIVE and report.reused_tokens == 200
    runtime.clear()
    runtime.prepare(stream[:120] + random_tokens(50, seed=8), marks=[120])  # shares only 120
    report = runtime.prepare(stream[:260], marks=[200], checkpoints=[at200])
    assert report.source is Source.CHECKPOINT and report.reused_tokens == 200


def test_a_checkpoint_or_live_cache_of_another_scope_is_never_reused(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """The runtime's own guard, under the store's: state prepared for one scope is never the
    start of another's prompt, so what a request reuses tells nothing of other scopes."""
    runtime = make_runtime(tiny_models["dense"], n_ctx=1024, n_batch=64)
    stream = random_tokens(300)
    (window,) = _capture_at(runtime, stream, 200)  # prepared for the window's scope
    assert window.scope == ""
    runtime.clear()
    saved: list[Checkpoint] = []
    report = runtime.prepare(stream[:260], marks=[200], checkpoints=[window], save_at=[200],
                             on_checkpoint=saved.append, scope="api:b")
    assert report.source is Source.NONE and report.failed_checkpoints == ()
    assert runtime.live_scope == "api:b"
    assert [c.scope for c in saved] == ["api:b"]  # made from state prepared for api:b
    # The live cache holds api:b's 260 tokens: the window cannot reuse them; api:b can.
    report = runtime.prepare(stream[:290], marks=[200, 260])
    assert report.source is Source.NONE and report.reused_tokens == 0
    runtime.prepare(stream[:260], marks=[200], scope="api:b")
    report = runtime.prepare(stream[:290], marks=[200, 260], checkpoints=[window],
                             scope="api:b")
    assert report.source is Source.LIVE and report.reused_tokens == 260
    _assert_same_as_full_decode(runtime, stream[:290], [200, 260])


@pytest.mark.parametrize("kind", [MemoryKind.DENSE, MemoryKind.RECURRENT],
                         ids=lambda k: k.value)
def test_a_generator_reuses_state_only_within_the_requests_scope(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """Issue 24's cache oracle at the engine: client a's private note left in the cache and
    the store; client b sending the same text reuses nothing of it (so `cached_tokens` and
    the time tell b nothing), and each scope still reuses its own state."""
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16)
    store = CheckpointStore(runtime.identity())
    generator = Generator(runtime, sampling=GREEDY, checkpoints=store)
    tree = Tree("Keep my notes.")
    note = tree.add_child(tree.root.id, Role.USER, "Private: the vault code is 4417.")
    path = tree.path_to(note.id)

    def answer(scope: str) -> tuple[int, str]:
        prepared = generator.prepare(path, scope=scope)
        text = generator.generate(max_tokens=8, seed=3).text
        generator.after_reply()  # as the engine does after the request's last event
        return prepared.report.reused_tokens, text

    first, text = answer("api:a")
    assert first == 0 and {c.scope for c in store.all()} == {"api:a"}
    assert answer("api:b") == (0, text)  # a's live cache and checkpoints are not b's
    again, same = answer("api:b")
    assert again > 0 and same == text  # b's own state serves b
    if kind is MemoryKind.RECURRENT:  # a's node-end checkpoints, with b's state live
        assert answer("api:a")[0] > 0
    # A warm-up prepares for its own scope: a's exact prefix in the context is not b's.
    assert generator.warm(path, scope="api:a") is not None
    assert generator.warm(path, scope="api:a") is None
    assert generator.warm(path, scope="api:b") is not None
    # The reply never depends on the cache: the same words from a context that saw nothing.
    cold = Generator(make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16),
                     sampling=GREEDY, use_cache=False)
    cold.prepare(path)
    assert cold.generate(max_tokens=8, seed=3).text == text



WORDS = "the river carries silt from the mountains to the delta where herons wait"
LONG_TEXT = " ".join(f"{word}{i % 7}" for i, word in enumerate(WORDS.split(" ") * 20))


def _edited_in_the_middle(text: str) -> str:
    words = text.split(" ")
    middle = len(words) // 2
    return " ".join([*words[:middle], "(and mind the herons)", *words[middle:]])


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_an_edit_inside_a_long_message_restarts_at_the_grid_point_before_it(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """The benchmark's edit in the middle of a long last message: every kind decodes at
    most a grid step plus the rest of the prompt (the kinds that cannot cut back restore an
    inner checkpoint), and the reply is a full reprocess's."""
    runtime = make_runtime(tiny_models[kind.value], n_ctx=2048, n_batch=64)
    grid = runtime.grid
    store = CheckpointStore(runtime.identity())
    generator = Generator(runtime, sampling=GREEDY, checkpoints=store)
    tree = Tree("S")
    first = tree.add_child(tree.root.id, Role.USER, "Hello.")
    tree.add_child(first.id, Role.ASSISTANT, "Hi.")
    long = tree.add_child(tree.active_leaf, Role.USER, LONG_TEXT)
    path = tree.path_to(long.id)
    generator.prepare(path)
    generator.generate(max_tokens=8, seed=3)
    generator.after_reply()
    before = generator.prompts.target(path)
    start = sum(len(node.tokens or ()) for node in path[:-1])
    assert len(path[-1].tokens or ()) >= 8 * grid  # a long message
    inner = sorted(c.n_tokens for c in store.inner())
    if kind is MemoryKind.DENSE:
        assert inner == []  # its cache is cut back instead
    else:
        assert inner and all(start < n < len(before) and n % grid == 0 for n in inner)

    edited = tree.add_sibling(long.id, _edited_in_the_middle(LONG_TEXT))
    edited_path = tree.path_to(edited.id)
    report = generator.prepare(edited_path).report
    logits = runtime.last_logits().copy()
    text = generator.generate(max_tokens=8, seed=3).text
    target = generator.prompts.target(edited_path)
    change = next(i for i, (a, b) in enumerate(zip(before, target, strict=False)) if a != b)
    assert start + grid < change  # the change is well inside the message
    assert report.source is (Source.LIVE if kind is MemoryKind.DENSE else Source.CHECKPOINT)
    assert report.reused_tokens > change - grid
    assert report.decoded_tokens < grid + len(target) - change
    # Exactly a full reprocess: the logits, and the reply of a context that saw nothing else.
    assert np.array_equal(logits, fresh_logits(runtime, target,
                                               generator.prompts.target_marks(edited_path)))
    cold = Generator(make_runtime(tiny_models[kind.value], n_ctx=2048, n_batch=64),
                     sampling=GREEDY, use_cache=False)
    cold.prepare(edited_path)
    assert cold.generate(max_tokens=8, seed=3).text == text


def test_inner_checkpoints_take_only_the_room_the_others_leave(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """Under a small budget the checkpoints at message and prompt ends all stay in RAM and
    the inner ones share what is left, the latest kept; with no room none is even taken."""
    runtime = make_runtime(tiny_models["recurrent"], n_ctx=2048, n_batch=64)
    tree = Tree("S")
    long = tree.add_child(tree.root.id, Role.USER, LONG_TEXT)
    path = tree.path_to(long.id)

    def send(store: CheckpointStore) -> list[Checkpoint]:
        runtime.clear()
        generator = Generator(runtime, sampling=GREEDY, checkpoints=store)
        generator.prepare(path)
        generator.generate(max_tokens=4, seed=3)
        generator.after_reply()
        return sorted(store.all(), key=lambda c: c.n_tokens)

    roomy = CheckpointStore(runtime.identity())
    everything = send(roomy)
    size = everything[0].size  # a recurrent state is the same size everywhere
    assert {c.size for c in everything} == {size}
    inner = sorted(c.n_tokens for c in roomy.inner())
    ends = {c.n_tokens for c in everything} - set(inner)
    assert len(inner) > 2
    # The ends' footprints count their kept logits too (the prompt end's); inner ones keep none.
    ends_bytes = sum(c.footprint for c in everything if c.n_tokens in ends)
    assert all(c.footprint == size for c in roomy.inner())
    small = CheckpointStore(runtime.identity(), ram_budget=ends_bytes + 2 * size)
    kept = send(small)
    assert {c.n_tokens for c in kept} == ends | set(inner[-2:])
    assert small.stats().ram_count == len(kept)
    # Full of message ends: the next prepare plans no inner checkpoint at all.
    small.ram_budget = ends_bytes
    created = small.created
    send(small)
    assert small.created == created and {c.n_tokens for c in small.all()} == ends


def test_the_smollm2_restore_is_bit_identical(
    smollm2_path: Path, make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(smollm2_path, n_ctx=1024, n_batch=256)
    stream = random_tokens(400)
    (checkpoint,) = _capture_at(runtime, stream, 200)
    runtime.clear()
    runtime.prepare(stream, marks=[200], checkpoints=[checkpoint])
    assert np.array_equal(runtime.last_logits(), fresh_logits(runtime, stream, [200]))


# --- the store -----------------------------------------------------------------------------


def _fake(tokens: list[int], size: int, node: int) -> Checkpoint:
    return Checkpoint(
        tokens=tuple(tokens), blob=bytearray(size), bounds=(len(tokens),), node_id=node
    )


def test_budget_spills_the_least_valuable_to_disk_before_dropping(tmp_path: Path) -> None:
    store = CheckpointStore(_identity(), key=KEY, ram_budget=2500, disk_dir=tmp_path,
                            disk_budget=2000)
    active = _fake([1, 2, 3], 1000, node=1)
    old = _fake([1, 2, 4], 1000, node=2)
    recent = _fake([1, 2, 5], 1000, node=3)
    for checkpoint in (active, old, recent):
        store.add(checkpoint)
    store.protect([1])
    store.enforce_budget()
    stats = store.stats()
    assert (stats.count, stats.ram_count, stats.disk_count) == (3, 2, 1)
    assert stats.ram_bytes == 2000 and stats.disk_bytes > 1000
    assert store.nodes_with_checkpoints() == {1: "ram", 2: "disk", 3: "ram"}
    spilled = next(c for c in store.all() if c.node_id == 2)
    fetched = store.fetch(spilled)
    assert fetched is not None and fetched.blob == bytearray(1000)
    # Over the disk budget too: the least valuable go for good.
    store.ram_budget = 0
    store.enforce_budget()
    assert store.stats().disk_count <= 2 and store.stats().ram_count == 0


def test_spills_give_way_to_a_waiting_request_within_the_slack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that waits stops the spills, in the middle of one (its file is not kept,
    the checkpoint stays in RAM and serves), while RAM is at most a quarter over the
    budget; over that they go on down to it. A later call finishes the job."""
    monkeypatch.setattr(checkpoints_module, "SPILL_PIECE", 100)
    store = CheckpointStore(_identity(), key=KEY, ram_budget=4000, disk_dir=tmp_path)
    for node in range(1, 7):  # 6,000 bytes: 2,000 over, 1,000 over the slack
        store.add(_fake([1, 2, node], 1000, node=node))
    checks = []

    def waits() -> bool:
        checks.append(len(checks))
        return True

    store.enforce_budget(yield_to=waits)
    stats = store.stats()
    assert (stats.ram_bytes, stats.disk_count) == (5000, 1)  # the slack's edge: 5,000
    assert checks  # asked, once within the slack
    assert len(list(tmp_path.rglob("*"))) == 2  # the folder and one file: no temp left

    # A request comes in the middle of a spill: its file goes, the checkpoint stays.
    checks.clear()
    # 500 over: one spill, given up while its file is written (1 check before it, 10
    # pieces hashed, then 2 of its 10 pieces written)
    store.ram_budget = 4500
    store.enforce_budget(yield_to=lambda: len(checks) > 12 or bool(checks.append(0)))
    assert len(checks) == 13
    assert store.stats().ram_bytes == 5000 and store.stats().disk_count == 1
    assert len(list(tmp_path.rglob("*"))) == 2
    for checkpoint in store.all():
        fetched = store.fetch(checkpoint)
        assert fetched is not None and fetched.blob == bytearray(1000)

    store.enforce_budget()  # nothing waits: down to the budget
    assert store.stats().ram_bytes == 4000 and store.stats().disk_count == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.booleans()), min_size=1, max_size=25))
def test_under_a_constant_stream_of_requests_ram_stays_within_the_slack(
    stream: list[tuple[int, bool]],
) -> None:
    """A request waits after every one (`yield_to` always true, or now and then): spills give
    way each time, yet RAM never ends a call more than a quarter over the budget, nothing is
    lost, and an idle call brings it down to the budget."""
    with tempfile.TemporaryDirectory() as folder:
        store = CheckpointStore(_identity(), key=KEY, ram_budget=4000, disk_dir=Path(folder))
        for node, (size, waiting) in enumerate(stream, 1):
            store.add(_fake([1, 2, node], size, node=node))
            store.enforce_budget(yield_to=lambda waiting=waiting: waiting)
            ram = store.stats().ram_bytes
            assert ram <= (4000 + 4000 // checkpoints_module.SPILL_SLACK if waiting else 4000)
        assert {c.node_id for c in store.all()} == set(range(1, len(stream) + 1))
        store.enforce_budget()
        assert store.stats().ram_bytes <= 4000
        for checkpoint in store.all():
            fetched = store.fetch(checkpoint)
            assert fetched is not None and fetched.blob == bytearray(len(fetched.blob or b""))


def test_without_a_disk_tier_eviction_drops(tmp_path: Path) -> None:
    store = CheckpointStore(_identity(), ram_budget=1000)
    store.add(_fake([1], 800, node=1))
    store.add(_fake([2], 800, node=2))
    store.protect([2])
    store.enforce_budget()
    assert [c.node_id for c in store.all()] == [2]



def test_inner_checkpoints_are_evicted_first_and_never_spilled(tmp_path: Path) -> None:
    """Under a small budget the checkpoints inside messages go before any message-end or
    prompt-end one, even one off the active branch, and they are dropped, not written to
    disk (they come many to a message)."""
    store = CheckpointStore(_identity(), key=KEY, ram_budget=3000, disk_dir=tmp_path)
    store.protect([1])
    store.add(_fake([1, 2, 3], 1000, node=9))  # a prompt end off the active branch
    store.add(_fake([1, 2], 1000, node=1))  # a message end on it
    assert store.inner_room() == 1000 and store.largest() == 1000
    store.add(_fake([1], 600, node=1), inner=True)
    store.add(_fake([1, 5], 600, node=1), inner=True)  # over: the older inner one goes at once
    assert sorted(c.n_tokens for c in store.all()) == [2, 2, 3]
    assert store.stats().ram_bytes == 2600 and store.inner_room() == 1000
    store.add(_fake([1, 2, 3, 4], 1000, node=1))  # a new prompt end: over the budget
    store.enforce_budget()
    stats = store.stats()
    assert (stats.count, stats.ram_count, stats.disk_count) == (3, 3, 0)
    assert {c.n_tokens for c in store.all()} == {2, 3, 4}  # the inner one went, not to disk
    assert list(tmp_path.rglob("*.ckpt")) == []
    store.ram_budget = 1000  # now message ends spill, the least valuable first
    store.enforce_budget()
    assert store.nodes_with_checkpoints() == {1: "ram", 9: "disk"}


def test_a_state_kept_as_inner_and_as_a_message_end_is_a_message_end() -> None:
    store = CheckpointStore(_identity(), ram_budget=1000)
    store.add(_fake([1, 2], 800, node=1), inner=True)
    store.add(_fake([1, 2], 800, node=1))  # the same state, now where a message ends
    store.add(_fake([1, 3], 800, node=1), inner=True)
    assert [c.tokens for c in store.all()] == [(1, 2)]  # only the inner one was dropped


def test_deleting_nodes_frees_their_checkpoints(tmp_path: Path) -> None:
    store = CheckpointStore(_identity(), key=KEY, ram_budget=0, disk_dir=tmp_path)
    store.add(_fake([1], 10, node=1))
    store.add(_fake([2], 10, node=2))
    store.enforce_budget()  # both to disk
    files = list(tmp_path.rglob("*.ckpt"))
    assert len(files) == 2
    assert store.drop_nodes([1, 7]) == 1
    assert [c.node_id for c in store.all()] == [2]
    assert len(list(tmp_path.rglob("*.ckpt"))) == 1


def test_a_store_offers_each_scope_only_its_own_checkpoints() -> None:
    """Scopes (one per API `user`, "" the window) share nothing: the same state made for two
    scopes is kept twice, and a search never finds another scope's."""
    store = CheckpointStore(_identity())
    tokens = [5, 6, 7, 8]
    for scope in ("", "api:a", "api:b", "api:a"):
        store.add(Checkpoint(tokens=tuple(tokens[:3]), blob=b"s", bounds=(3,), scope=scope))
    assert sorted(c.scope for c in store.all()) == ["", "api:a", "api:b"]
    schedule = decode_schedule(4, n_batch=64, marks=[3])
    for scope in ("", "api:a", "api:b"):
        assert [c.scope for c in store.candidates(tokens, schedule, scope=scope)] == [scope]
    assert store.candidates(tokens, schedule, scope="api:c") == []


def _logits(seed: int, n_vocab: int = 50) -> bytes:
    return np.random.default_rng(seed).standard_normal(n_vocab).astype("<f4").tobytes()


def test_a_target_that_ends_at_a_checkpoint_fits_it_only_with_its_logits() -> None:
    tokens = (5, 6, 7)
    schedule = decode_schedule(3, n_batch=64)
    bare = Checkpoint(tokens=tokens, blob=b"s", bounds=(3,))
    kept = Checkpoint(tokens=tokens, blob=b"s", bounds=(3,), logits=_logits(1))
    assert not bare.fits(packed(tokens), schedule) and kept.fits(packed(tokens), schedule)
    assert (bare.has_logits, kept.has_logits, kept.logits_size) == (False, True, 200)
    assert kept.footprint == 1 + 200
    spilled = replace(kept, blob=None, logits=None)  # as the store keeps one on disk
    assert spilled.has_logits and spilled.fits(packed(tokens), schedule)


def test_the_budgets_count_the_logits(tmp_path: Path) -> None:
    """Logits are n_vocab floats (1 MiB on Gemma 3's 262k vocabulary): a budget that holds
    two blobs holds one blob with its logits."""
    store = CheckpointStore(_identity(), key=KEY, ram_budget=2 * 1000, disk_dir=tmp_path)
    store.add(Checkpoint(tokens=(1,), blob=bytearray(1000), bounds=(1,), node_id=1,
                         logits=bytes(800)))
    store.add(_fake([2], 1000, node=2))
    store.protect([2])
    assert store.stats().ram_bytes == 2800
    store.enforce_budget()
    stats = store.stats()
    assert (stats.ram_count, stats.disk_count, stats.ram_bytes) == (1, 1, 1000)
    assert stats.disk_bytes > 1800  # the file holds the logits too


def test_the_disk_budget_counts_whole_files(tmp_path: Path) -> None:
    """A file holds its header (every token of the prefix) as well as blob and logits."""
    tokens = list(range(1000, 1200))
    store = CheckpointStore(_identity(), key=KEY, ram_budget=0, disk_dir=tmp_path,
                            disk_budget=3 * 1000)
    for k in range(3):
        store.add(Checkpoint(tokens=(*tokens, k), blob=bytearray(500), bounds=(201,),
                             logits=bytes(400)))
    store.enforce_budget()
    stats = store.stats()
    assert 0 < stats.disk_count < 3 and 0 < stats.disk_bytes <= 3 * 1000


def test_the_same_state_with_its_logits_replaces_the_one_without() -> None:
    store = CheckpointStore(_identity())
    bare = Checkpoint(tokens=(1, 2), blob=b"s", bounds=(2,))
    kept = Checkpoint(tokens=(1, 2), blob=b"s", bounds=(2,), logits=_logits(1))
    store.add(bare)
    store.add(kept)
    assert [c.id for c in store.all()] == [kept.id]
    store.add(bare)  # the same state without them adds nothing
    assert [c.id for c in store.all()] == [kept.id]


def test_the_disk_tier_keeps_the_logits_and_checks_them(tmp_path: Path) -> None:
    logits = _logits(3)
    (path,) = spill(tmp_path, [Checkpoint(tokens=(1, 2, 3), blob=_blob(1), bounds=(3,),
                                          logits=logits)])
    store = tier_store(tmp_path)
    (indexed,) = store.all()
    assert indexed.logits is None and indexed.logits_size == len(logits)  # not read yet
    assert store.candidates([1, 2, 3], decode_schedule(3, n_batch=64)) == [indexed]
    fetched = store.fetch(indexed)
    assert fetched is not None and fetched.logits == logits and fetched.blob == _blob(1)
    # One bit of the logits flipped, the header left as it was: refused and removed.
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    store = tier_store(tmp_path)
    (indexed,) = store.all()
    assert store.fetch(indexed) is None
    assert store.stats().rejected == 1 and tier_files(tmp_path) == []


def test_logits_swapped_between_two_files_are_rejected(tmp_path: Path) -> None:
    files = spill(tmp_path, [
        Checkpoint(tokens=(1, 2, 3), blob=_blob(1), bounds=(3,), logits=_logits(1)),
        Checkpoint(tokens=(1, 2, 4), blob=_blob(2), bounds=(3,), logits=_logits(2)),
    ])
    data = [f.read_bytes() for f in files]
    n = len(_logits(1))
    for path, mine, theirs in ((files[0], data[0], data[1]), (files[1], data[1], data[0])):
        path.write_bytes(mine[:-n] + theirs[-n:])
    store = tier_store(tmp_path)
    assert all(store.fetch(c) is None for c in store.all())
    assert store.stats().rejected == 2 and tier_files(tmp_path) == []


def test_a_file_of_version_3_is_read_as_a_checkpoint_without_logits(tmp_path: Path) -> None:
    """Written before logits were kept: its state still serves, and its prompt's last chunk
    is decoded again, as then."""
    (path,) = spill(tmp_path, [Checkpoint(tokens=(1, 2, 3), blob=_blob(1), bounds=(3,))])
    _, header, blob = split(path.read_bytes())
    old = _edit(logits_size=..., logits_sha256=...)(json.loads(header))
    path.write_bytes(file_head(KEY, old, 3) + old + blob)
    store = tier_store(tmp_path)
    (checkpoint,) = store.all()
    assert not checkpoint.has_logits and store.stats().rejected == 0
    fetched = store.fetch(checkpoint)
    assert fetched is not None and fetched.blob == _blob(1) and fetched.logits is None
    assert store.candidates([1, 2, 3], decode_schedule(3, n_batch=64)) == []
    # Signed as version 3 but carrying logits after the blob: its sizes do not add up.
    path = tier_files(tmp_path)[0]
    path.write_bytes(file_head(KEY, old, 3) + old + blob + _logits(1))
    assert len(tier_store(tmp_path)) == 0 and tier_files(tmp_path) == []


def test_the_disk_tier_keeps_a_checkpoints_scope_and_an_old_file_is_the_windows(
    tmp_path: Path,
) -> None:
    (path,) = spill(tmp_path, [Checkpoint(tokens=(1, 2, 3), blob=_blob(1), bounds=(3,),
                                          scope="api:a")])
    (kept,) = tier_store(tmp_path).all()
    assert kept.scope == "api:a"
    # A file written before scopes (no such field, signed): the window's.
    _, header, blob = split(path.read_bytes())
    forge(path, _edit(scope=...)(json.loads(header)), blob)
    store = tier_store(tmp_path)
    (old,) = store.all()
    assert old.scope == "" and store.stats().rejected == 0
    fetched = store.fetch(old)
    assert fetched is not None and fetched.blob == _blob(1)


def test_identity_changes_with_every_setting_that_shapes_the_state() -> None:
    keys = {
        _identity().key(),
        _identity(model_sha256="b" * 64).key(),
        _identity(n_ctx=2048).key(),
        _identity(n_batch=128).key(),
        _identity(type_k="q8_0").key(),
        _identity(flash_attn="on").key(),
        _identity(swa_full=True).key(),
        _identity(llama_cpp_python="0.3.37").key(),
        # A state made with offload or on RPC workers never goes into a CPU context.
        _identity(devices="cuda").key(),
        _identity(devices="cpu,rpc:10.0.0.5:50052").key(),
    }
    assert len(keys) == 10


# --- hostile files in the disk tier: removed, never loaded, never fatal --------------------
#
# Anyone who can write the cache folder can put files there. Only files this installation
# signed for this identity are offered, and each blob only under the header it was written
# with; every other file is removed, so it cannot fail again at the next start.


def tier_store(folder: Path, key: bytes = KEY, identity: Identity | None = None
               ) -> CheckpointStore:
    return CheckpointStore(identity or _identity(), key=key, ram_budget=0, disk_dir=folder)


def spill(folder: Path, checkpoints: Sequence[Checkpoint],
          identity: Identity | None = None) -> list[Path]:
    """Write `checkpoints` to the disk tier under `folder` through a store; their files."""
    store = tier_store(folder, identity=identity)
    for checkpoint in checkpoints:
        store.add(checkpoint)
    store.enforce_budget()
    assert store.stats().disk_count == len(checkpoints)
    return tier_files(folder, identity)


def tier_files(folder: Path, identity: Identity | None = None) -> list[Path]:
    return sorted((folder / (identity or _identity()).key()).glob("*.ckpt"))


def split(data: bytes) -> tuple[bytes, bytes, bytes]:
    """A tier file's head (magic, version, header length, tag), JSON header and what
    follows (the blob, and the logits if any)."""
    (length,) = struct.unpack_from("<I", data, 12)  # after the magic and the version
    start = len(file_head(KEY, b""))
    return data[:start], data[start:start + length], data[start + length:]


def forge(path: Path, header: bytes, blob: bytes, key: bytes = KEY) -> None:
    """Write a tier file with this header and blob, signed with `key`."""
    path.write_bytes(file_head(key, header) + header + blob)


def _blob(seed: int, size: int = 300) -> bytes:
    return bytes((seed * 31 + i * 7) % 251 for i in range(size))


def test_a_disk_tier_needs_the_key_that_signs_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="key"):
        CheckpointStore(_identity(), disk_dir=tmp_path)
    assert len(CheckpointStore(_identity())) == 0  # the RAM tier alone needs none


@pytest.mark.parametrize("recompute", [True, False], ids=["checksum recomputed", "as is"])
def test_blobs_swapped_between_two_files_are_rejected_and_removed(
    recompute: bool, tmp_path: Path
) -> None:
    files = spill(tmp_path, [
        Checkpoint(tokens=(1, 2, 3), blob=_blob(1), bounds=(3,)),
        Checkpoint(tokens=(1, 2, 4), blob=_blob(2), bounds=(3,)),
    ])
    (head_a, header_a, blob_a), (head_b, header_b, blob_b) = (split(f.read_bytes())
                                                             for f in files)
    for path, head, header, old, new in ((files[0], head_a, header_a, blob_a, blob_b),
                                         (files[1], head_b, header_b, blob_b, blob_a)):
        if recompute:  # the same length: the header keeps its size
            header = header.replace(hashlib.sha256(old).hexdigest().encode(),
                                    hashlib.sha256(new).hexdigest().encode())
        path.write_bytes(head + header + new)
    store = tier_store(tmp_path)
    assert all(store.fetch(c) is None for c in store.all())
    assert store.stats().rejected == 2 and len(store) == 0
    assert tier_files(tmp_path) == []


def test_a_file_signed_with_another_key_is_rejected_and_removed(tmp_path: Path) -> None:
    spill(tmp_path, [Checkpoint(tokens=(1, 2, 3), blob=_blob(1), bounds=(3,))])
    store = tier_store(tmp_path, key=b"another installation's key 32 by")
    assert len(store) == 0 and store.stats().rejected == 1
    assert tier_files(tmp_path) == []


def test_another_models_file_with_its_identity_rewritten_is_rejected(tmp_path: Path) -> None:
    other = _identity(model_sha256="0" * 64)
    for path in spill(tmp_path, [Checkpoint(tokens=(1, 2, 3), blob=_blob(1), bounds=(3,))],
                      identity=other):
        target = tmp_path / _identity().key() / path.name
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(path.read_bytes().replace(b"0" * 64, b"a" * 64))
        path.unlink()
    assert len(tier_files(tmp_path)) == 1
    store = tier_store(tmp_path)
    assert len(store) == 0 and store.stats().rejected == 1
    assert tier_files(tmp_path) == []


def test_a_file_of_the_previous_version_is_discarded(tmp_path: Path) -> None:
    folder = tmp_path / _identity().key()
    folder.mkdir()
    blob = _blob(1)
    header = json.dumps({
        "identity": asdict(_identity()), "tokens": [1, 2, 3], "bounds": [3], "flags": 0,
        "node_id": 1, "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
    }).encode()
    (folder / "1-1.ckpt").write_bytes(b"ARBORCKP" + struct.pack("<II", 2, len(header))
                                      + header + blob)
    store = tier_store(tmp_path)
    assert len(store) == 0 and store.stats().rejected == 1
    assert tier_files(tmp_path) == []


def _edit(**fields: object) -> Callable[[dict[str, Any]], bytes]:
    """A header with these fields changed (a value of ... removes the field)."""
    def apply(header: dict[str, Any]) -> bytes:
        for name, value in fields.items():
            if value is ...:
                del header[name]
            else:
                header[name] = value
        return dumps_strict(header)
    return apply


def _raw(name: str, text: bytes) -> Callable[[dict[str, Any]], bytes]:
    """A header whose field `name` holds `text`, as it is (no JSON writer would make it)."""
    return lambda header: _edit(**{name: "RAW"})(header).replace(b'"RAW"', text)


HEADER_DAMAGE: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "flags missing": _edit(flags=...),
    "flags null": _edit(flags=None),
    "flags text": _edit(flags="0"),
    "flags true": _edit(flags=True),
    "flags too large": _edit(flags=1 << 40),
    "flags infinite": _raw("flags", b"1e400"),
    "flags Infinity": _raw("flags", b"Infinity"),
    "flags partial": _edit(flags=1),  # a partial state is never written: its cache is gone
    "size huge": _edit(size=1 << 62),
    "size negative": _edit(size=-1),
    "size missing": _edit(size=...),
    "sha256 missing": _edit(sha256=...),
    "logits size missing": _edit(logits_size=...),
    "logits size negative": _edit(logits_size=-4),
    "logits size not whole floats": _edit(logits_size=3),
    "logits size text": _edit(logits_size="0"),
    "logits size past the end": _edit(logits_size=400),
    "logits checksum missing": _edit(logits_sha256=...),
    "logits checksum not text": _edit(logits_sha256=5),
    "tokens empty": _edit(tokens=[], bounds=[]),
    "tokens not ints": _edit(tokens=[1, 2.5, 3]),
    "token negative": _edit(tokens=[1, -2, 3]),
    "bounds wrong": _edit(bounds=[2]),
    "identity missing": _edit(identity=...),
    "scope not text": _edit(scope=5),
    "scope too long": _edit(scope="x" * 10_000),
    "not an object": lambda header: b"[1, 2, 3]",
    "deep nesting": lambda header: b"[" * 100_000 + b"]" * 100_000,
    "duplicate key": _raw("flags", b'0,"flags":0'),
    "not UTF-8": _raw("flags", b'"\xff"'),
    "not JSON": lambda header: b"{",
}


@pytest.mark.parametrize("damage", HEADER_DAMAGE)
def test_a_bad_header_even_signed_never_stops_a_start_and_is_removed(
    damage: str, tmp_path: Path
) -> None:
    """Signed with the right key, so only the header's own checks stand between it and a
    crash (a bug of ours could write one; so could anyone holding the key)."""
    (path,) = spill(tmp_path, [Checkpoint(tokens=(1, 2, 3), blob=_blob(1), bounds=(3,))])
    _, header, blob = split(path.read_bytes())
    forge(path, HEADER_DAMAGE[damage](json.loads(header)), blob)
    store = tier_store(tmp_path)
    assert len(store) == 0 and store.stats().rejected == 1
    assert tier_files(tmp_path) == []
    assert tier_store(tmp_path).stats().rejected == 0  # the next start is clean


def test_a_declared_length_is_never_allocated_before_the_bytes_are_there(
    tmp_path: Path,
) -> None:
    """Memory is bounded by the file, not by what its header says."""
    (path,) = spill(tmp_path, [Checkpoint(tokens=(1, 2, 3), blob=_blob(1), bounds=(3,))])
    data = path.read_bytes()
    lying = data[:12] + struct.pack("<I", 1 << 26) + data[16:]  # a 64 MiB header, it says
    _, header, blob = split(data)
    second = path.with_name("2-2.ckpt")
    forge(second, dumps_strict({**json.loads(header), "size": 1 << 40}), blob)
    path.write_bytes(lying)
    tracemalloc.start()
    try:
        store = tier_store(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(store) == 0 and store.stats().rejected == 2
    assert peak < 1 << 20
    assert tier_files(tmp_path) == []


def test_a_fifo_a_symlink_or_a_folder_named_like_a_checkpoint_never_stops_a_start(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    (valid,) = spill(elsewhere, [Checkpoint(tokens=(1, 2, 3), blob=_blob(1), bounds=(3,))])
    folder = tmp_path / "tier" / _identity().key()
    folder.mkdir(parents=True)
    os.mkfifo(folder / "1-1.ckpt")  # opened for reading, it would wait for a writer forever
    (folder / "2-2.ckpt").symlink_to(valid)  # a valid file, but not one of the tier's
    (folder / "3-3.ckpt").mkdir()
    store = tier_store(tmp_path / "tier")
    assert len(store) == 0 and store.stats().rejected == 3
    assert [p.name for p in folder.iterdir()] == ["3-3.ckpt"]  # a folder cannot be unlinked
    assert valid.exists()  # the link went, not what it pointed to


# --- faults on the disk tier: rejected before llama.cpp sees them -------------------------


def _spill_session(runtime: Runtime, store: CheckpointStore) -> Session:
    session = Session(runtime, system="S", sampling=GREEDY, seed=1, checkpoints=store)
    session.send("Tell me about oak trees.", GenerationOptions(max_tokens=8))
    session.send("And their roots?", GenerationOptions(max_tokens=8))
    return session


def _corrupt_truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def _corrupt_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-50] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fault", ["truncate", "bitflip", "other_model", "other_n_ctx"])
def test_a_damaged_or_foreign_disk_checkpoint_is_rejected_and_the_reply_stays_correct(
    fault: str,
    tiny_models: dict[str, Path],
    make_runtime: RuntimeFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = make_runtime(tiny_models["recurrent"], n_ctx=1024, n_batch=64)
    disk = tmp_path / "tier"
    store = CheckpointStore(runtime.identity(), key=KEY, ram_budget=0, disk_dir=disk)
    session = _spill_session(runtime, store)
    assert store.stats().disk_count > 0 and store.stats().ram_count == 0
    files = sorted((disk / runtime.identity().key()).glob("*.ckpt"))
    if fault in ("other_model", "other_n_ctx"):
        # Blobs written by another context land where this one looks (a copied cache dir).
        other_identity = (
            replace(runtime.identity(), model_sha256="0" * 64)
            if fault == "other_model"
            else replace(runtime.identity(), n_ctx=2048)
        )
        foreign = CheckpointStore(other_identity, key=KEY, ram_budget=0,
                                  disk_dir=tmp_path / "other")
        for checkpoint in store.all():
            fetched = store.fetch(checkpoint)
            assert fetched is not None
            foreign.add(fetched)
        foreign.enforce_budget()
        for path in files:
            path.unlink()
        for path in (tmp_path / "other" / other_identity.key()).glob("*.ckpt"):
            path.rename(disk / runtime.identity().key() / path.name)
        store = CheckpointStore(runtime.identity(), key=KEY, ram_budget=0, disk_dir=disk)
        assert len(store) == 0 and store.stats().rejected > 0  # refused at the index
        session.checkpoints = store
    else:
        for path in files:
            (_corrupt_truncate if fault == "truncate" else _corrupt_flip)(path)
    handed: list[int] = []
    original = runtime.ctx.state_set

    def watched(blob: bytes | bytearray, flags: int = 0) -> int:
        handed.append(len(blob))
        return original(blob, flags)

    monkeypatch.setattr(runtime.ctx, "state_set", watched)
    runtime.clear()  # force the step to look for a checkpoint
    session.tree.rewind(session.tree.message(2).id)
    report = session.regenerate(GenerationOptions(max_tokens=8))
    assert handed == []  # nothing damaged or foreign reached llama.cpp
    assert report.report is not None and report.report.source is Source.NONE

    reference = Session(runtime, system="S", sampling=GREEDY, seed=1, use_cache=False)
    reference.send("Tell me about oak trees.", GenerationOptions(max_tokens=8))
    reference.send("And their roots?", GenerationOptions(max_tokens=8, seed=1 + 2))
    assert report.text == reference.tree.message(3).text


def test_disk_checkpoints_survive_a_restart_and_are_used_when_everything_matches(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory, tmp_path: Path
) -> None:
    disk = tmp_path / "tier"
    first = make_runtime(tiny_models["hybrid"], n_ctx=1024, n_batch=64)
    store = CheckpointStore(first.identity(), key=KEY, ram_budget=0, disk_dir=disk)
    _spill_session(first, store)
    assert store.stats().disk_count > 0
    first.close()

    second = make_runtime(tiny_models["hybrid"], n_ctx=1024, n_batch=64)
    reopened = CheckpointStore(second.identity(), key=KEY, disk_dir=disk)
    assert len(reopened) == store.stats().disk_count
    _spill_session(second, reopened)  # the same conversation, after a restart
    assert reopened.stats().restored >= 1
    assert reopened.stats().rejected == 0

    other_ctx = make_runtime(tiny_models["hybrid"], n_ctx=512, n_batch=64)
    assert len(CheckpointStore(other_ctx.identity(), key=KEY, disk_dir=disk)) == 0


def test_the_just_restored_checkpoint_is_kept_and_no_new_one_is_made_at_once(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models["recurrent"], n_ctx=1024, n_batch=64)
    store = CheckpointStore(runtime.identity())
    session = _spill_session(runtime, store)
    positions_before = sorted(c.pos_max for c in store.all())
    restored_before = store.stats().restored
    runtime.clear()
    session.regenerate(GenerationOptions(max_tokens=8))
    after = sorted(c.pos_max for c in store.all())
    assert store.stats().restored == restored_before + 1
    # The restored one is still there, and restoring it created nothing new: the prompt's
    # end was already saved, and the gate knows where the last checkpoint is.
    assert after == positions_before


def test_deleting_a_branch_frees_its_checkpoints(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models["recurrent"], n_ctx=1024, n_batch=64)
    store = CheckpointStore(runtime.identity())
    session = _spill_session(runtime, store)
    second_user = session.tree.message(2).id
    attached = [c for c in store.all() if c.node_id == second_user]
    assert attached
    session.delete_branch(second_user)
    assert all(c.node_id != second_user for c in store.all())
    assert len(store) == session.checkpoints.stats().count  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_the_prompt_end_checkpoint_is_taken_after_the_first_token_and_is_exact(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """Copying the cache at the prompt's end would delay the first token; it waits until the
    first token is sampled (on a dense cache, whose copy is the whole KV cache, until the
    reply is over), and still holds exactly the prompt."""
    runtime = make_runtime(tiny_models[kind.value], n_ctx=512, n_batch=16)
    target = random_tokens(60, seed=3)
    events: list[str] = []
    saved: list[Checkpoint] = []

    def keep(checkpoint: Checkpoint) -> None:
        events.append(f"checkpoint {checkpoint.n_tokens}")
        saved.append(checkpoint)

    runtime.prepare(target, save_at=[32, 60], on_checkpoint=keep)  # 32: a grid chunk end
    assert events == ["checkpoint 32"]  # the one inside the prompt is taken at once
    runtime.generate(max_tokens=3, sampling=GREEDY, seed=1,
                     on_token=lambda token, _piece: events.append(f"token {token}"))
    assert events[0] == "checkpoint 32" and events[1].startswith("token ")
    if runtime.captures_after_reply:
        assert len(events) == 4 and events[3].startswith("token ")
        runtime.flush_capture()  # the engine's after_reply
        assert events[4] == "checkpoint 60" and len(events) == 5
    else:
        assert events[2] == "checkpoint 60" and len(events) == 5
    assert saved[-1].tokens == tuple(target) and saved[-1].has_logits
    assert not saved[0].has_logits  # taken inside the prompt: no logits were computed there
    runtime.clear()
    report = runtime.prepare(target, checkpoints=saved)  # the logits kept: nothing to decode
    assert (report.checkpoint_pos, report.decoded_tokens) == (59, 0)
    _assert_same_as_full_decode(runtime, target)


def test_a_deferred_checkpoint_is_kept_when_no_reply_follows(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models["recurrent"], n_ctx=512, n_batch=16)
    target = random_tokens(40, seed=5)
    saved: list[Checkpoint] = []
    runtime.prepare(target, save_at=[40], on_checkpoint=saved.append)
    assert saved == []
    runtime.prepare([*target, 7, 8, 9], marks=[40], save_at=[], on_checkpoint=saved.append)
    assert [c.n_tokens for c in saved] == [40]  # flushed before the context moved on
    assert saved[0].tokens == tuple(target)


def test_a_checkpoint_is_a_prefix_by_its_tokens_also_after_a_replace() -> None:
    checkpoint = Checkpoint(tokens=(300, 301, 302), blob=b"s", bounds=(3,))
    assert checkpoint.is_prefix_of(packed([300, 301, 302, 303]))
    assert not checkpoint.is_prefix_of(packed([300, 301]))
    assert not checkpoint.is_prefix_of(packed([300, 301, 999, 303]))
    moved = replace(checkpoint, tokens=(300, 301))
    assert moved.key == packed([300, 301]) and moved.is_prefix_of(packed([300, 301, 999]))
