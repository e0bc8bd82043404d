"""Replay on real models: cached answers equal full-reprocess answers, and every reported
reuse is one the memory kind can really keep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.core.memory import MemoryKind
from engine.llm.runtime import PrepareReport, Runtime, RuntimeSettings, Source
from engine.service.replay import CacheMode, replay, run_step
from engine.service.scenario import parse_scenario
from engine.service.session import Session
from tests.conftest import ALL_KINDS

ROOT = Path(__file__).resolve().parents[3]

STEPS: list[dict[str, Any]] = [
    {"op": "send", "text": "Tell me about the oak tree and its leaves.", "max_tokens": 12},
    {"op": "send", "text": "How deep do its roots grow?", "max_tokens": 12},
    {"op": "warm"},
    {"op": "send", "text": "And how old can it get?", "max_tokens": 12},
    {"op": "edit", "message": 2, "text": "How tall can it grow?", "max_tokens": 12},
    {"op": "regenerate", "max_tokens": 12},
    {"op": "edit", "message": 0, "text": "Tell me about rivers.", "max_tokens": 12},
    {"op": "switch", "message": 0, "variant": 0},
    {"op": "warm"},
    {"op": "send", "text": "Thanks. One more fact?", "max_tokens": 12},
    {"op": "edit", "message": 4, "text": "Thanks! Another fact?", "max_tokens": 12},
    {"op": "rewind", "message": 1},
    {"op": "send", "text": "Where does it grow?", "max_tokens": 12},
]


def _scenario(model: Path, n_batch: int = 64, **extra: Any) -> dict[str, Any]:
    return {
        "model": str(model), "n_ctx": 2048, "n_batch": n_batch, "seed": 7,
        "sampling": {"temperature": 0.0}, "system": "You are a botanist.",
        "steps": STEPS, **extra,
    }


def _texts(report: dict[str, Any]) -> list[str | None]:
    return [step["text"] for step in report["steps"]]


def _check_accounting(report: dict[str, Any]) -> None:
    for step in report["steps"]:
        if step["prompt_tokens"] is not None:
            assert step["reused_tokens"] + step["decoded_tokens"] == step["prompt_tokens"]
            # Nothing decoded: a prompt that ended where one ended before, whose last
            # token's logits were kept (a regenerate; a continue of a user message, which
            # the report calls a reply).
            assert step["decoded_tokens"] >= 2 or (
                step["decoded_tokens"] == 0 and step["op"] in ("regenerate", "reply"))
            assert step["source"] in ("live", "checkpoint", "none")
            assert (step["source"] == "none") == (step["reused_tokens"] == 0)


def _decoded(report: dict[str, Any], op: str) -> list[int]:
    return [s["decoded_tokens"] for s in report["steps"] if s["op"] == op]


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_cached_replies_equal_full_reprocess_on_every_memory_kind(
    kind: MemoryKind, tiny_models: dict[str, Path]
) -> None:
    # A small n_batch makes the sliding-window cache (n_swa 32) drop early positions.
    scenario = parse_scenario(_scenario(tiny_models[kind.value], n_batch=32))
    cached = replay(scenario, cache=CacheMode.CHECKPOINTS)
    reference = replay(scenario, cache=CacheMode.NONE)
    assert _texts(cached) == _texts(reference)
    assert all(t for t, s in zip(_texts(cached), STEPS, strict=True)
               if s["op"] not in ("switch", "rewind", "warm"))
    # After a warm-up, a send decodes only the new message (and the reply's header).
    for i, step in enumerate(STEPS):
        if step["op"] == "warm":
            warmed, sent = cached["steps"][i], cached["steps"][i + 1]
            assert warmed["decoded_tokens"] > 0 and sent["source"] == "live"
            assert sent["reused_tokens"] == warmed["prompt_tokens"]
    _check_accounting(cached)
    _check_accounting(reference)
    assert _decoded(cached, "regenerate") == [0]  # the prompt's end and its logits were kept
    assert all(s["reused_tokens"] in (0, None) for s in reference["steps"])
    assert cached["model"]["memory_kind"] == kind.value
    # Checkpoints and the live cache saved work on every memory kind.
    decoded = sum(s["decoded_tokens"] or 0 for s in cached["steps"])
    assert decoded < sum(s["decoded_tokens"] or 0 for s in reference["steps"]) // 2
    assert cached["checkpoints"]["restored"] > 0
    assert reference["checkpoints"] == {"enabled": False}


def test_cached_replies_equal_full_reprocess_on_smollm2(smollm2_path: Path) -> None:
    scenario = parse_scenario(_scenario(smollm2_path, n_batch=512))
    cached = replay(scenario, cache=CacheMode.CHECKPOINTS)
    reference = replay(scenario, cache=CacheMode.NONE)
    assert _texts(cached) == _texts(reference)
    _check_accounting(cached)
    assert _decoded(cached, "regenerate") == [0]
    assert cached["model"]["name"].startswith("Smollm2")
    assert len(cached["model"]["file_sha256"]) == 64


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_every_reported_reuse_is_valid_for_the_memory_kind(
    kind: MemoryKind, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Watch the runtime under the scenario and check each claim against the cache."""
    runtime = Runtime(tiny_models[kind.value], RuntimeSettings(n_ctx=2048, n_batch=32))
    seen: list[tuple[tuple[int, ...], int, int, list[int], PrepareReport]] = []
    original = runtime.prepare

    def watched(target: list[int], **kwargs: Any) -> PrepareReport:
        live, canonical = runtime.live_tokens, runtime.canonical_tokens
        pos_min = runtime.ctx.pos_min()
        report = original(target, **kwargs)
        seen.append((live, canonical, pos_min, list(target), report))
        return report

    monkeypatch.setattr(runtime, "prepare", watched)
    try:
        session = Session(runtime, system="You are a botanist.", seed=7,
                          sampling=parse_scenario(_scenario(Path("x"))).sampling)
        for step in parse_scenario(_scenario(Path("x"))).steps:
            run_step(session, step)
    finally:
        runtime.close()
    assert len(seen) == sum(1 for s in STEPS if s["op"] in ("send", "edit", "regenerate", "warm"))
    for live, canonical, pos_min, target, report in seen:
        if report.source is not Source.LIVE:
            continue
        n = report.reused_tokens
        assert tuple(target[:n]) == live[:n] and n <= canonical
        if kind in (MemoryKind.RECURRENT, MemoryKind.HYBRID):
            # Only a state that is exactly a prefix of the target can be kept.
            assert len(live) == canonical == n
        if kind is MemoryKind.SLIDING_WINDOW:
            assert pos_min <= max(0, n - runtime.n_swa)
    if kind in (MemoryKind.DENSE, MemoryKind.SLIDING_WINDOW):
        assert any(r.source is Source.LIVE for *_, r in seen)


def test_replay_command_writes_a_report_and_exits_0(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(_scenario(tiny_models["dense"]) | {"steps": STEPS[:3]}))
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "engine", "replay", str(path), "--cache", "none",
         "--report", str(out)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["cache"] == "none"
    assert [s["op"] for s in report["steps"]] == ["send", "send", "warm"]
    assert report["model"]["memory_kind"] == "dense"
    assert {"prefill_ms", "ttft_ms", "generated_tokens", "checkpoint_pos"} <= set(
        report["steps"][0]
    )


def test_replay_of_a_step_that_does_not_fit_the_tree_exits_2(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    path = tmp_path / "scenario.json"
    bad = [STEPS[0], {"op": "edit", "message": 5, "text": "x"}]
    path.write_text(json.dumps(_scenario(tiny_models["dense"]) | {"steps": bad}))
    result = subprocess.run(
        [sys.executable, "-m", "engine", "replay", str(path)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "arbor-engine: step 1 (edit): message 5 does not exist "
        "(the active path has 2 messages)"
    ]


def test_replay_export_step_writes_the_whole_tree(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    from engine.core.records import to_tree
    from engine.storage.formats.arbor_file import read_session

    out = tmp_path / "session.arbor"
    steps = [*STEPS[:7], {"op": "export", "path": str(out)}]  # a warm-up among them
    report = replay(parse_scenario(_scenario(tiny_models["recurrent"]) | {"steps": steps}))
    assert report["steps"][-1]["op"] == "export"
    (record,) = read_session(out).conversations
    tree = to_tree(record)
    assert len(tree) == 1 + 3 * 2 + 2 + 1 + 2  # root, 3 sends, an edit, a regeneration, an edit
    texts = [s["text"] for s in report["steps"][:7]]
    assert texts[6] in [n.text for n in tree.messages()]
    assert all(n.tokens for n in tree.nodes() if n.role.value == "assistant")


EVERY_OP: list[dict[str, Any]] = [
    {"op": "system", "text": "You are a careful botanist."},
    {"op": "send", "text": "Tell me about the oak tree.", "max_tokens": 10},
    {"op": "send", "text": "How deep do its roots grow?", "max_tokens": 10},
    {"op": "send", "text": "And how old can it get?", "max_tokens": 10},
    {"op": "regenerate", "message": 1, "max_tokens": 10},  # an earlier reply, not the last
    {"op": "activate", "message": 1, "variant": 0},  # back to the first version's branch
    {"op": "delete", "message": 4},
    {"op": "undo"},
    {"op": "send", "text": "Thank you.", "max_tokens": 6},
    {"op": "rewind", "message": 2},
    {"op": "continue", "max_tokens": 8},  # the rewound-to user message gets a reply
    {"op": "continue", "max_tokens": 6},  # and more of that reply
    {"op": "fork", "message": 3},
    {"op": "send", "text": "In the fork: and the ash tree?", "max_tokens": 10},
]


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_every_operation_replays_and_equals_a_full_reprocess(
    kind: MemoryKind, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    data = {"model": str(tiny_models[kind.value]), "n_ctx": 2048, "n_batch": 32, "seed": 5,
            "sampling": {"temperature": 0.7}, "steps": EVERY_OP}
    scenario = parse_scenario(data)
    cached = replay(scenario, cache=CacheMode.CHECKPOINTS, db=tmp_path / "c.db")
    reference = replay(scenario, cache=CacheMode.NONE, db=tmp_path / "n.db")
    assert _texts(cached) == _texts(reference)
    ops = [step["op"] for step in cached["steps"]]
    assert ops[4] == "regenerate" and cached["steps"][4]["text"]
    assert ops[11] == "continue" and cached["steps"][11]["generated_tokens"] is not None
    _check_accounting(cached)
    # An earlier reply regenerated, and a reply to the rewound-to message: prompts that
    # ended there before, sampled from the logits their checkpoints kept. More of a reply
    # decodes the reply's tokens again, batched (one-token decodes are not prompt state).
    assert _decoded(cached, "regenerate") == [0] and _decoded(cached, "reply") == [0]
    assert _decoded(cached, "continue")[0] > 0
    from engine.storage.store import Store

    with Store(tmp_path / "c.db") as store:
        titles = [c.title for c in store.list()]
        assert len(titles) == 2 and any(t.endswith("(fork)") for t in titles)
        fork = store.load(cached["conversation_id"])
        assert [n.text for n in fork.messages()][-2] == "In the fork: and the ash tree?"
        assert fork.root.text == "You are a careful botanist."
        original = next(c.id for c in store.list() if not c.title.endswith("(fork)"))
        tree = store.load(original)
        # The deleted branch came back: the third message and its reply are there again.
        assert "And how old can it get?" in [n.text for n in tree.nodes()]


@pytest.mark.engine_process
@pytest.mark.parametrize("kind", [MemoryKind.DENSE, MemoryKind.HYBRID], ids=lambda k: k.value)
def test_the_engine_process_replays_every_operation_as_the_engine_in_process_does(
    kind: MemoryKind, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """`--engine-process`: every reply crosses the protocol the window uses, and the report
    is the in-process one: the same texts, the same reuse, the same tree in the store."""
    data = {"model": str(tiny_models[kind.value]), "n_ctx": 2048, "n_batch": 32, "seed": 5,
            "sampling": {"temperature": 0.7}, "steps": [*STEPS[:4], *EVERY_OP]}
    scenario = parse_scenario(data)
    here = replay(scenario, cache=CacheMode.CHECKPOINTS, db=tmp_path / "here.db")
    there = replay(scenario, cache=CacheMode.CHECKPOINTS, db=tmp_path / "there.db",
                   engine_process=True)
    assert (here["engine"], there["engine"]) == ("in-process", "process")
    assert _texts(there) == _texts(here)
    figures = ("op", "prompt_tokens", "reused_tokens", "decoded_tokens", "source",
               "generated_tokens")
    assert [[s[k] for k in figures] for s in there["steps"]] == \
        [[s[k] for k in figures] for s in here["steps"]]
    assert there["model"] == here["model"] and there["chat_template"] == here["chat_template"]
    assert there["checkpoints"]["count"] == here["checkpoints"]["count"] > 0
    from engine.storage.store import Store

    with Store(tmp_path / "here.db") as a, Store(tmp_path / "there.db") as b:
        for mine, theirs in zip(a.list(), b.list(), strict=True):
            nodes = [(n.role, n.text, n.tokens, n.status) for n in a.load(mine.id).nodes()]
            assert nodes == [(n.role, n.text, n.tokens, n.status)
                             for n in b.load(theirs.id).nodes()]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The forecast for a city.",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 12}}}}}
TOOL_STEPS: list[dict[str, Any]] = [
    {"op": "send", "text": "Will it rain in Oslo?", "tool_choice": "required",
     "max_tokens": 100},
    {"op": "results", "texts": ['{"sky": "rain", "temp_c": 9}'], "max_tokens": 12},
    {"op": "edit", "message": 2, "text": '{"sky": "clear", "temp_c": 14}', "max_tokens": 12},
    {"op": "switch", "message": 2, "variant": 0},
    {"op": "regenerate", "max_tokens": 12},
    {"op": "regenerate", "message": 1, "tool_choice": "get_weather", "max_tokens": 100},
    {"op": "results", "texts": ["sunny"], "max_tokens": 12},
]


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_a_tool_loop_replays_and_equals_a_full_reprocess(
        kind: MemoryKind, tool_models: dict[str, Path]) -> None:
    """A forced call, its result answered, the result edited, a switch back to the first
    result, a regenerated answer, a retried call and its result: every text equals a full
    reprocess, and the cache decodes only the tails."""
    scenario = parse_scenario({
        "model": str(tool_models[kind.value]), "n_ctx": 2048, "n_batch": 32, "seed": 3,
        "sampling": {"temperature": 0.0}, "tools": [WEATHER], "steps": TOOL_STEPS})
    cached = replay(scenario, cache=CacheMode.CHECKPOINTS)
    reference = replay(scenario, cache=CacheMode.NONE)
    assert _texts(cached) == _texts(reference)
    _check_accounting(cached)
    steps = cached["steps"]
    assert [s["op"] for s in steps] == ["send", "results", "edit", "switch", "regenerate",
                                         "regenerate", "results"]
    for step, ref in zip(steps, reference["steps"], strict=True):
        if step["prompt_tokens"] is not None and step["op"] != "send":
            assert step["decoded_tokens"] < ref["decoded_tokens"] // 2, step  # the tail only
    # The edited result decodes only itself: the call's reply and the path before are kept.
    assert steps[2]["reused_tokens"] >= steps[1]["reused_tokens"]
    assert steps[4]["decoded_tokens"] == 0  # the first result's prompt end kept its logits
