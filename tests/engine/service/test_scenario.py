"""Scenario validation and the replay command's exit status on bad input (no model needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.service.scenario import Op, ScenarioError, load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[3]


def _scenario(*steps: dict[str, object], **top: object) -> dict[str, object]:
    return {"model": "default", "steps": list(steps), **top}


def test_a_valid_scenario_parses_with_defaults() -> None:
    s = parse_scenario(
        _scenario(
            {"op": "send", "text": "hi", "max_tokens": 8},
            {"op": "regenerate"},
            {"op": "edit", "message": 0, "text": "hey"},
            {"op": "switch", "message": 0, "variant": 0},
            {"op": "rewind", "message": 1},
            seed=42,
            sampling={"temperature": 0.0},
        )
    )
    assert [step.op for step in s.steps] == [Op.SEND, Op.REGENERATE, Op.EDIT, Op.SWITCH, Op.REWIND]
    assert s.seed == 42 and s.sampling.greedy
    assert s.steps[0].max_tokens == 8


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "top level must be a JSON object"),
        ({"model": "default"}, "missing field `steps`"),
        (_scenario(), "`steps` is empty"),
        (_scenario({"op": "fly"}), "step 0: unknown op 'fly'"),
        (_scenario({"op": "send"}), "step 0 (send): missing field `text`"),
        (_scenario({"op": "send", "text": 3}), "step 0 (send): `text` must be a string"),
        (
            _scenario({"op": "send", "text": "a"}, {"op": "edit", "message": -1, "text": "x"}),
            "step 1 (edit): `message` must be 0 or more",
        ),
        (_scenario({"op": "rewind", "message": True}), "`message` must be an integer"),
        (_scenario({"op": "send", "text": "a", "colour": 1}), "unknown field `colour`"),
        (_scenario({"op": "send", "text": "a", "max_tokens": 0}), "`max_tokens` must be at least"),
        (_scenario({"op": "send", "text": "a"}, n_ctx=4), "`n_ctx` must be at least 16"),
        (_scenario({"op": "send", "text": "a"}, sampling={"temp": 1}), "unknown field `temp`"),
        (_scenario({"op": "delete"}), "step 0 (delete): missing field `message`"),
        (_scenario({"op": "fork", "message": -1}), "step 0 (fork): `message` must be 0 or more"),
        (_scenario({"op": "system"}), "step 0 (system): missing field `text`"),
        (_scenario({"op": "undo", "message": 1}), "step 0 (undo): unknown field `message`"),
        (_scenario({"op": "activate", "message": 0}), "missing field `variant`"),
    ],
)
def test_invalid_scenarios_name_the_step_and_the_problem(data: object, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_scenario(data)


def test_nan_and_bad_json_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"steps": [{"op": "send", "text": "a"}], "sampling": {"temperature": NaN}}')
    with pytest.raises(ScenarioError, match="NaN"):
        load_scenario(path)
    path.write_text("{")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_scenario(path)


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_replay_of_an_invalid_scenario_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_scenario({"op": "send", "text": "a"}, {"op": "switch"})))
    result = _run_cli("replay", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "step 1 (switch): missing field `message`" in lines[0]
    assert result.stdout == ""


def test_replay_with_a_missing_model_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_scenario({"op": "send", "text": "a"}, model="nope.gguf")))
    result = _run_cli("replay", str(path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"arbor-engine: model file not found: {tmp_path / 'nope.gguf'}"
    ]
