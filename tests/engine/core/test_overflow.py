"""A branch that outgrows the context: stop, or leave the oldest messages out. Either way
what the cache does never changes a word: a cached reply equals a full reprocess of the part
of the path the model reads."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.bench.random_models import Quant
from engine.core.errors import ContextOverflowError
from engine.core.memory import MemoryKind
from engine.core.overflow import Overflow, cut_places, fit, read_part, reply_room
from engine.core.results import LEFT_OUT
from engine.core.tree import Role
from engine.llm.runtime import Runtime, RuntimeSettings
from engine.service.replay import CacheMode, replay
from engine.service.scenario import ScenarioError, parse_scenario
from engine.service.session import GenerationOptions, Session
from tests.conftest import ALL_KINDS, QUANTS

# --- where the cut goes (no model) ----------------------------------------------------------


def _turns(n: int, rng: random.Random) -> tuple[list[int], list[bool]]:
    """A system prompt and n user/assistant turns of random lengths."""
    lengths, user = [rng.randint(0, 30)], [False]
    for _ in range(n):
        lengths += [rng.randint(3, 60), rng.randint(3, 90)]
        user += [True, False]
    return lengths, user


def test_nothing_is_left_out_while_the_path_fits_or_under_stop() -> None:
    lengths, user = [10, 50, 60, 40], [False, True, False, True]
    for policy in Overflow:
        assert fit(lengths, user, tail=5, n_ctx=1000, room=100, policy=policy).start == 1
    stop = fit(lengths, user, tail=5, n_ctx=100, room=50, policy=Overflow.STOP)
    assert stop.start == 1 and stop.dropped == 0 and stop.tokens == 160


def test_the_cut_leaves_room_for_the_reply_and_keeps_the_system_prompt() -> None:
    rng = random.Random(3)
    for _ in range(300):
        lengths, user = _turns(rng.randint(1, 30), rng)
        lengths[-1:] = []  # the path ends with the user message being answered
        user[-1:] = []
        n_ctx = rng.choice([256, 512, 1024])
        tail, room = 4, reply_room(n_ctx, rng.choice([16, 64, 512]))
        cut = fit(lengths, user, tail=tail, n_ctx=n_ctx, room=room, policy=Overflow.DROP_OLDEST)
        kept = read_part(list(range(len(lengths))), cut)
        assert kept[0] == 0 and kept[-1] == len(lengths) - 1
        assert cut.tokens == sum(lengths[i] for i in kept)
        if sum(lengths) + tail + room <= n_ctx:
            assert cut.dropped == 0
            continue
        assert cut.dropped > 0 and user[cut.start]  # the read part starts with a question
        if cut.start in cut_places(lengths, user, n_ctx // 4):
            assert cut.tokens + tail + room <= n_ctx
            # The place before it would not have fitted: nothing more is left out than needed.
            earlier = [p for p in cut_places(lengths, user, n_ctx // 4) if p < cut.start]
            before = lengths[0] + sum(lengths[earlier[-1]:])
            assert before + tail + room > n_ctx
        else:  # no place fits: only the newest question is read
            assert cut.start == len(lengths) - 1


def test_the_cut_moves_forward_in_large_steps_as_the_conversation_grows() -> None:
    """The kept prefix stays the same for several turns, so its checkpoints stay valid; each
    move leaves out at least a quarter of the context."""
    rng = random.Random(11)
    n_ctx, room = 1024, 128
    lengths, user = _turns(120, rng)
    starts = []
    for end in range(2, len(lengths), 2):  # after each user message
        cut = fit(lengths[:end], user[:end], tail=4, n_ctx=n_ctx, room=room,
                  policy=Overflow.DROP_OLDEST)
        starts.append(cut.start)
        # The places of a shorter path are the places of the longer one, up to its end.
        shorter = cut_places(lengths[:end], user[:end], n_ctx // 4)
        assert shorter == [p for p in cut_places(lengths, user, n_ctx // 4) if p < end]
    assert starts == sorted(starts)
    moves = [(a, b) for a, b in itertools.pairwise(starts) if a != b]
    assert len(moves) >= 5
    for a, b in moves:
        assert sum(lengths[a:b]) >= n_ctx // 4
    # Between two moves the cut stays put for more than one turn.
    assert len(starts) / (len(moves) + 1) > 2


# --- on real models -------------------------------------------------------------------------

QUESTIONS = [
    "Tell me about the oak tree and its leaves, please, in some detail.",
    "How deep do the roots of an old oak grow into the ground?",
    "And how old can such a tree get before it dies of age?",
    "Which animals live in its crown and eat its acorns in autumn?",
    "What kind of soil does it like best, sand or clay or loam?",
    "How do foresters plant new oaks after a storm has felled the old ones?",
    "Is oak wood good for building ships, and why was it used for that?",
    "What diseases threaten oaks in Europe today, and can they be treated?",
    "Tell me one surprising fact about oak galls and the wasps that make them.",
    "Thank you. Could you sum up what we talked about in two sentences?",
]


def _steps() -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"op": "send", "text": q, "max_tokens": 24} for q in QUESTIONS[:7]
    ]
    steps += [
        {"op": "regenerate", "max_tokens": 24},  # on the cut the last send made
        {"op": "edit", "message": 10, "text": QUESTIONS[8], "max_tokens": 24},
        {"op": "warm"},
        {"op": "send", "text": QUESTIONS[9], "max_tokens": 24},
        {"op": "switch", "message": 10, "variant": 0},
        {"op": "send", "text": QUESTIONS[7], "max_tokens": 24},
        {"op": "edit", "message": 0, "text": "Tell me about rivers.", "max_tokens": 24},
        {"op": "switch", "message": 0, "variant": 0},
        {"op": "continue", "max_tokens": 8},
        {"op": "send", "text": QUESTIONS[4], "max_tokens": 24},
    ]
    return steps


def _scenario(model: Path, overflow: str, **extra: Any) -> dict[str, Any]:
    return {"model": str(model), "n_ctx": 256, "n_batch": 32, "seed": 7,
            "sampling": {"temperature": 0.7}, "system": "You are a botanist.",
            "overflow": overflow, "steps": _steps(), **extra}


def _texts(report: dict[str, Any]) -> list[str | None]:
    return [step["text"] for step in report["steps"]]


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_leaving_messages_out_keeps_cached_replies_equal_to_a_full_reprocess(
    kind: MemoryKind, tiny_models: dict[str, Path]
) -> None:
    scenario = parse_scenario(_scenario(tiny_models[kind.value], "drop-oldest"))
    cached = replay(scenario, cache=CacheMode.CHECKPOINTS)
    reference = replay(scenario, cache=CacheMode.NONE)
    assert _texts(cached) == _texts(reference)
    # The same part of each path was read, cached or not (a warm-up runs only cached).
    assert [(s["prompt_tokens"], s["dropped"]) for s in cached["steps"] if s["op"] != "warm"] \
        == [(s["prompt_tokens"], s["dropped"]) for s in reference["steps"] if s["op"] != "warm"]
    steps = [s for s in cached["steps"] if s["prompt_tokens"] is not None]
    assert all(s["prompt_tokens"] < 256 for s in steps)
    dropping = [s for s in steps if s["dropped"]]
    assert len(dropping) >= 4
    # The edit of the first message starts a short branch again: nothing left out there.
    assert cached["steps"][13]["op"] == "edit" and cached["steps"][13]["dropped"] == 0
    # A kept prefix is reused: the live cache or a checkpoint serves replies that leave
    # messages out, beyond the system prompt (a switch back restores one).
    assert sum(1 for s in dropping if s["reused_tokens"] > 100) >= 2
    assert any(s["source"] == "checkpoint" and s["dropped"] for s in steps)
    assert sum(s["decoded_tokens"] for s in steps) < sum(
        s["decoded_tokens"] for s in reference["steps"] if s["decoded_tokens"] is not None)


@pytest.mark.parametrize("quant", QUANTS, ids=lambda q: q.value)
def test_leaving_messages_out_on_quantized_models_and_gemma(
    quant: Quant, quantized_models: Callable[[MemoryKind, Quant], Path], gemma_path: Path
) -> None:
    """Each quantization on the memory kind it exercises least elsewhere, then the real
    K-quant sliding-window model, where chunking changes the bits."""
    kinds = {quant: ALL_KINDS[i % len(ALL_KINDS)] for i, quant in enumerate(QUANTS)}
    models = [quantized_models(kinds[quant], quant)]
    if quant is QUANTS[-1]:
        models.append(gemma_path)
    for model in models:
        scenario = parse_scenario(_scenario(model, "drop-oldest"))
        cached = replay(scenario, cache=CacheMode.CHECKPOINTS)
        reference = replay(scenario, cache=CacheMode.NONE)
        assert _texts(cached) == _texts(reference)
        assert any(s["dropped"] for s in cached["steps"])


def test_under_stop_the_same_conversation_stops_with_a_clear_message(
    tiny_models: dict[str, Path],
) -> None:
    scenario = parse_scenario(_scenario(tiny_models["dense"], "stop"))
    with pytest.raises(ContextOverflowError, match="tokens long but the context holds 256"):
        replay(scenario, cache=CacheMode.CHECKPOINTS)


def test_a_reply_counts_the_messages_it_left_out_and_the_tree_keeps_every_message(
    tiny_models: dict[str, Path],
) -> None:
    runtime = Runtime(tiny_models["dense"], RuntimeSettings(n_ctx=256, n_batch=32))
    try:
        session = Session(runtime, system="You are a botanist.", seed=3,
                          overflow=Overflow.DROP_OLDEST)
        options = GenerationOptions(max_tokens=24)
        reports = [session.send(q, options) for q in QUESTIONS[:8]]
    finally:
        runtime.close()
    last = reports[-1]
    assert last.report is not None and last.report.dropped > 0
    assert "outside the context" in last.report.describe()
    tree = session.tree
    reply = tree.node(tree.active_leaf)
    path = tree.active_path()
    assert reply.meta[LEFT_OUT] == last.report.dropped
    assert path[last.report.dropped + 1].role is Role.USER  # it read from a question on
    # Nothing was deleted: every question is still in the conversation.
    assert [n.text for n in tree.messages() if n.role is Role.USER] == QUESTIONS[:8]
    # A reply that left nothing out says nothing about it.
    assert LEFT_OUT not in tree.node(path[2].id).meta


def test_a_scenario_names_its_overflow_policy(tiny_models: dict[str, Path]) -> None:
    assert parse_scenario(_scenario(Path("x"), "stop")).overflow is Overflow.STOP
    with pytest.raises(ScenarioError, match="overflow"):
        parse_scenario(_scenario(Path("x"), "truncate"))
