"""The promise on Gemma 3 270M Q4_K_M: a real K-quant sliding-window model (swa_full off).

On this model llama.cpp's CPU kernels make a chunk's result depend on where the prompt was
split, so a reply equals a full reprocess only because every mode decodes a path by the same
schedule (engine.core.schedule). These tests pin the effect itself, then check the promise at
the level of logits (bit-identical) and of a whole branching conversation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.config.params import ContextParams
from engine.core.memory import MemoryKind
from engine.core.templates import TemplateOrigin
from engine.llm.llama import SamplingParams
from engine.llm.runtime import PrepareReport, Runtime, RuntimeSettings, Source
from engine.service.replay import run_step
from engine.service.scenario import load_scenario
from engine.service.session import Session, StepReport
from engine.storage.checkpoints import Checkpoint, CheckpointStore
from tests.conftest import RuntimeFactory
from tests.helpers import fresh_logits

SCENARIO = Path(__file__).parents[2] / "scenarios" / "branching_long.json"
PROSE = (
    "The old oak by the fence drops its leaves late in autumn, and the gardener rakes them "
    "into a pile behind the shed, where they rot slowly into a dark crumbly mould. "
)


def _prose(runtime: Runtime, n: int) -> list[int]:
    model = runtime.model
    tokens = [model.bos] if model.bos is not None else []
    while len(tokens) < n:
        tokens += model.tokenize(PROSE)
    return tokens[:n]


def test_on_gemma_where_a_prompt_is_split_changes_the_logits(
    gemma_path: Path, make_runtime: RuntimeFactory
) -> None:
    """The llama.cpp behaviour the decode schedule exists for. It belongs to the kernels a
    build picks on a CPU, not to llama.cpp as such: with weight repacking off on an AVX-512
    machine the logits were the same wherever the prompt was split. So the test measures:
    where the split changes nothing at all, it says so and what ran; where it changes
    something, it must be the large effect the schedule guards against. The invariant tests
    hold either way."""
    runtime = make_runtime(gemma_path, n_ctx=1024, n_batch=512)
    tokens = _prose(runtime, 104)

    def decode(*split: int) -> np.ndarray:
        runtime.clear()
        runtime.prepare(tokens, marks=split, use_live=False)
        return runtime.last_logits()

    whole = decode()
    gaps = {k: float(np.max(np.abs(decode(k) - whole))) for k in (11, 23)}
    if not any(gaps.values()):
        pytest.skip(f"this build's kernels ({runtime.kernels}) give bit-identical logits "
                    f"wherever a prompt is split (splits at {sorted(gaps)}: max gap 0.0)")
    for k, gap in gaps.items():
        assert gap > 0.1, f"splitting at {k} changes the logits only a little (max gap {gap})"


def test_on_gemma_a_restore_and_its_tail_are_bit_identical_to_a_full_reprocess(
    gemma_path: Path, make_runtime: RuntimeFactory
) -> None:
    """Past the 512-token window, so the sliding-window cache has dropped early positions."""
    runtime = make_runtime(gemma_path, n_ctx=2048, n_batch=512)
    assert runtime.memory_kind is MemoryKind.SLIDING_WINDOW and runtime.n_swa == 512
    stream = _prose(runtime, 1300)
    marks = [301, 777, 1003]
    saved: list[Checkpoint] = []
    runtime.prepare(stream[:1100], marks=marks, use_live=False, save_at=marks,
                    on_checkpoint=saved.append)
    assert [c.n_tokens for c in saved] == marks
    target = stream[:1003] + _prose(runtime, 400)[150:400]  # diverges after the third mark
    runtime.clear()
    report = runtime.prepare(target, marks=marks, checkpoints=saved)
    assert (report.source, report.reused_tokens) == (Source.CHECKPOINT, 1003)
    restored = runtime.last_logits()
    assert np.array_equal(restored, fresh_logits(runtime, target, marks))
    # A window cache is never cut back (the next tokens would land in other cells) ...
    runtime.prepare(stream[:1100], marks=marks)
    assert runtime.prepare(target, marks=marks).source is Source.NONE
    # ... but extended whole, once settled, it gives the same bits.
    runtime.prepare(stream[:1003], marks=marks)
    report = runtime.prepare(target, marks=marks)
    assert (report.source, report.reused_tokens) == (Source.LIVE, 1003)
    assert np.array_equal(runtime.last_logits(), restored)


@pytest.mark.parametrize("swa_full", [False, True], ids=["window-cache", "swa-full"])
def test_on_gemma_a_reply_from_the_restored_prompt_end_is_a_full_reprocess(
    swa_full: bool, gemma_path: Path, make_runtime: RuntimeFactory
) -> None:
    """A regenerate restores the prompt-end checkpoint and samples from its kept logits,
    decoding nothing. The restored cache is laid out from cell 0; the decoded one is not,
    and on this model a reply decoded into the one or the other parted at once (a logit
    apart by 19 after 40 tokens). Every mode settles the prompt's end before the reply's
    first decode, so they are the same cells, bit for bit."""
    runtime = make_runtime(gemma_path, n_ctx=2048, n_batch=512,
                           context=ContextParams(swa_full=swa_full))
    stream = _prose(runtime, 1300)  # past the 512-token window
    marks = [301, 777, 1003]
    saved: list[Checkpoint] = []
    hot = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    runtime.prepare(stream, marks=marks, use_live=False, save_at=[1300],
                    on_checkpoint=saved.append)
    fresh = runtime.generate(max_tokens=40, sampling=hot, seed=3)
    fresh_last = runtime.last_logits()
    runtime.clear()
    report = runtime.prepare(stream, marks=marks, checkpoints=saved)
    assert (report.source, report.decoded_tokens) == (Source.CHECKPOINT, 0)
    restored = runtime.generate(max_tokens=40, sampling=hot, seed=3)
    assert restored.tokens == fresh.tokens and len(fresh.tokens) == 40
    assert np.array_equal(runtime.last_logits(), fresh_last)


def _source(step: StepReport) -> Source | None:
    return step.report.source if step.report is not None else None


@dataclass
class Run:
    reports: list[StepReport]
    logits: list[np.ndarray]  # after every prepare: the prompt's last logits
    session: Session


def _replay_recording_logits(path: Path, *, use_cache: bool, swa_full: bool = False) -> Run:
    scenario = load_scenario(SCENARIO)
    runtime = Runtime(path, RuntimeSettings(n_ctx=scenario.n_ctx, n_batch=scenario.n_batch,
                                            context=ContextParams(swa_full=swa_full)))
    store = CheckpointStore(runtime.identity()) if use_cache else None
    session = Session(
        runtime, system=scenario.system, sampling=scenario.sampling, seed=scenario.seed,
        use_cache=use_cache, checkpoints=store,
    )
    logits: list[np.ndarray] = []
    prepare = runtime.prepare

    def recording(target: list[int], **kwargs: Any) -> PrepareReport:
        report = prepare(target, **kwargs)
        logits.append(runtime.last_logits())  # what the reply's first token is sampled from
        return report

    runtime.prepare = recording  # type: ignore[method-assign]
    try:
        reports = [run_step(session, step) for step in scenario.steps]
    finally:
        del runtime.prepare
    return Run(reports, logits, session)


@pytest.fixture(scope="module", params=[False, True], ids=["window-cache", "swa-full"])
def gemma_runs(gemma_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Run, Run]]:
    """The long branching scenario on Gemma, with checkpoints and as a full reprocess: with
    its sliding-window cache, and with a full-size one (`swa_full`), whose saved states hold
    only the window for the window layers all the same."""
    cached = _replay_recording_logits(gemma_path, use_cache=True, swa_full=request.param)
    reference = _replay_recording_logits(gemma_path, use_cache=False, swa_full=request.param)
    yield cached, reference
    cached.session.runtime.close()
    reference.session.runtime.close()


def test_on_gemma_a_branching_conversation_is_word_for_word_a_full_reprocess(
    gemma_runs: tuple[Run, Run],
) -> None:
    """Six long sends, an edit of the last message, a regenerate, an early edit, a switch back
    and a send, a rewind and a send: every reply and every prompt's logits equal the full
    reprocess, bit for bit, while the cached run decodes a fraction of the tokens."""
    mine, theirs = gemma_runs
    assert [r.text for r in mine.reports] == [r.text for r in theirs.reports]
    assert len(mine.logits) == len(theirs.logits) == 11
    for i, (a, b) in enumerate(zip(mine.logits, theirs.logits, strict=True)):
        assert np.array_equal(a, b), f"prompt {i}: logits differ"
    model_steps = [r.report for r in mine.reports if r.report is not None]
    for r in model_steps:
        assert r.reused_tokens + r.decoded_tokens == r.prompt_tokens
    decoded = sum(r.decoded_tokens for r in model_steps)
    full = sum(r.report.decoded_tokens for r in theirs.reports if r.report is not None)
    assert decoded < full // 3
    ops = [r.op for r in mine.reports]
    assert ops[7] == "regenerate" and _source(mine.reports[7]) is Source.CHECKPOINT
    assert ops[10] == "send" and _source(mine.reports[10]) is Source.CHECKPOINT  # switched back


def test_gemma_speaks_its_own_format_from_llama_cpps_built_in_template(
    gemma_runs: tuple[Run, Run],
) -> None:
    """The GGUF has no chat template; ChatML made Gemma answer with `<|im_end|>`."""
    mine, _ = gemma_runs
    template = mine.session.generator.template
    assert (template.name, template.origin) == ("gemma", TemplateOrigin.BUILTIN)
    model = mine.session.runtime.model
    prompt = "".join(model.token_text(t) for t in mine.session.runtime.live_tokens[:120])
    assert "<start_of_turn>user\n" in prompt and "<|im_start|>" not in prompt
    assert all("<|im_" not in (r.text or "") for r in mine.reports)


def test_gemma_samples_the_same_reply_after_a_restore(
    gemma_path: Path, make_runtime: RuntimeFactory
) -> None:
    """Sampling, not only greedy decoding, continues from the same state."""
    runtime = make_runtime(gemma_path, n_ctx=1024, n_batch=512)
    stream = _prose(runtime, 600)
    saved: list[Checkpoint] = []
    runtime.prepare(stream, marks=[257], save_at=[257], on_checkpoint=saved.append)
    hot = SamplingParams(temperature=1.0)
    fresh = runtime.generate(max_tokens=12, sampling=hot, seed=5).tokens
    runtime.clear()
    runtime.prepare(stream, marks=[257], checkpoints=saved)
    assert runtime.generate(max_tokens=12, sampling=hot, seed=5).tokens == fresh
