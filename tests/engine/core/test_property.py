"""Property: whatever sequence of tree operations a user performs, every reply with the cache
and checkpoints equals the reply of a full reprocess, and no step decodes more than the tail
after the best valid candidate."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.bench.random_models import Quant
from engine.core.memory import MemoryKind
from engine.core.prefix import packed
from engine.core.tree import Role, TreeError
from engine.llm.llama import SamplingParams
from engine.llm.runtime import PrepareReport, Runtime, RuntimeSettings
from engine.service.session import GenerationOptions, Session, StepReport
from engine.storage.checkpoints import CheckpointStore
from tests.conftest import ALL_KINDS, QUANTS

TEXTS = ["Hello there.", "What is a tree?", "Say more.", "Why?", "List three birds.", "Ok."]

operation = st.tuples(
    st.sampled_from(["send", "send", "regenerate", "edit", "switch", "rewind", "delete"]),
    st.integers(0, 20),
    st.integers(0, 3),
    st.sampled_from(TEXTS),
)


Pair = tuple[Runtime, Runtime]


@pytest.fixture(scope="module")
def runtimes(
    quantized_models: Callable[[MemoryKind, Quant], Path],
) -> Iterator[Callable[[MemoryKind, Quant], Pair]]:
    """Per kind and quantization: a runtime for the cached session and one for the
    full-reprocess reference, opened on first use."""
    opened: dict[tuple[MemoryKind, Quant], Pair] = {}

    def get(kind: MemoryKind, quant: Quant) -> Pair:
        if (kind, quant) not in opened:
            settings_ = RuntimeSettings(n_ctx=2048, n_batch=32)
            path = quantized_models(kind, quant)
            opened[kind, quant] = (Runtime(path, settings_), Runtime(path, settings_))
        return opened[kind, quant]

    yield get
    for pair in opened.values():
        for runtime in pair:
            runtime.close()


def _apply(session: Session, op: str, a: int, b: int, text: str) -> StepReport | None:
    tree = session.tree
    messages = tree.messages()
    options = GenerationOptions(max_tokens=6)
    try:
        if op == "send":
            if messages and messages[-1].role is Role.USER:
                return session.continue_reply(options)
            return session.send(text, options)
        if op == "regenerate" and messages:
            return session.regenerate(options)
        if op == "edit" and messages:
            node = messages[a % len(messages)]
            return session.edit(node.id, text, options)
        if op == "switch" and messages:
            session.switch(messages[a % len(messages)].id, b)
        elif op == "rewind" and messages:
            session.rewind(messages[a % len(messages)].id)
        elif op == "delete" and messages:
            session.delete_branch(messages[a % len(messages)].id)
    except TreeError:
        return None
    return None


@pytest.mark.parametrize("quant", QUANTS, ids=lambda q: q.value)
@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(operation, min_size=4, max_size=9))
def test_random_tree_operations_never_change_a_reply(
    kind: MemoryKind,
    quant: Quant,
    runtimes: Callable[[MemoryKind, Quant], Pair],
    ops: list[tuple[str, int, int, str]],
) -> None:
    """On every memory kind, in float32, block quantizations and a K-quant (whose CPU
    kernels make a chunk's result depend on where the prompt was split)."""
    cached_rt, reference_rt = runtimes(kind, quant)
    cached_rt.clear()
    sampling = SamplingParams(temperature=0.8)
    store = CheckpointStore(cached_rt.identity(), ram_budget=64 << 20)
    cached = Session(cached_rt, system="Be kind.", sampling=sampling, seed=11, checkpoints=store)
    reference = Session(
        reference_rt, system="Be kind.", sampling=sampling, seed=11, use_cache=False
    )
    bounds: list[int] = []
    original = cached_rt.prepare

    def watched(target: list[int], **kwargs: Any) -> PrepareReport:
        schedule = cached_rt.schedule(len(target), kwargs.get("marks", ()))
        best = cached_rt.live_reuse(target, schedule)
        for checkpoint in kwargs.get("checkpoints", ()):
            if checkpoint.fits(packed(target), schedule):
                best = max(best, checkpoint.n_tokens)
        report = original(target, **kwargs)
        bounds.append(len(target) - best)
        if not report.failed_checkpoints:
            assert report.decoded_tokens <= len(target) - best
        return report

    cached_rt.prepare = watched  # type: ignore[method-assign]
    try:
        for op, a, b, text in [("send", 0, 0, TEXTS[0]), *ops]:
            mine = _apply(cached, op, a, b, text)
            theirs = _apply(reference, op, a, b, text)
            assert (mine is None) == (theirs is None)
            if mine is not None and theirs is not None:
                assert mine.text == theirs.text, f"{op}: cached reply differs"
                if mine.report is not None:  # the step ran the model
                    figures = mine.report
                    assert figures.reused_tokens + figures.decoded_tokens == figures.prompt_tokens
                    assert figures.decoded_tokens <= bounds[-1]
            assert [n.text for n in cached.tree.messages()] == [
                n.text for n in reference.tree.messages()
            ]
    finally:
        del cached_rt.prepare

