"""Fuzzing the files a user (or anything on the machine) can put in Arbor's way: any settings
file loads as settings in range and stays as it was; any scenario is a Scenario or a
ScenarioError."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config.settings import Settings, load_settings, save_settings, settings_path
from engine.service.scenario import Scenario, ScenarioError, load_scenario

FUZZ = settings(max_examples=250, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

VALID_SETTINGS = Settings(n_ctx=2048, n_gpu_layers=12, seed=7, type_v="q8_0",
                          flash_attn="on",  # type: ignore[arg-type]
                          model="/models/x.gguf", templates={"/models/x.gguf": "chatml"})
VALID_SCENARIO: dict[str, Any] = {
    "model": "default", "n_ctx": 2048, "n_batch": 64, "seed": 3,
    "sampling": {"temperature": 0.5, "top_k": 40}, "system": "Be brief.",
    "steps": [{"op": "send", "text": "hi", "max_tokens": 8}, {"op": "regenerate"},
              {"op": "edit", "message": 0, "text": "hey"},
              {"op": "switch", "message": 0, "variant": 1}],
}

# JSON values a hostile file may hold: wrong types, huge and negative numbers, long and
# control-laden text, nesting.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=50)
    | st.sampled_from(["\x1b[31m", "a\nb", "x" * 5000, "\ud800", "auto", "q8_0", "dark"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                     children, max_size=4),
    max_leaves=20,
)


@st.composite
def byte_mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with a few flips, cuts, insertions or deletions."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        at = draw(st.integers(0, max(len(out) - 1, 0)))
        if kind == "flip" and out:
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del out[at:]
        elif kind == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=8)
                              | st.sampled_from([b"[" * 5000, b"9" * 5000, b"\xff", b"NaN"]))
        elif out:
            del out[at:at + draw(st.integers(1, 16))]
    return bytes(out)


@st.composite
def structural_mutations(draw: st.DrawFn, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with keys replaced by hostile values, removed or added, nested a level down."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    for _ in range(draw(st.integers(1, 3))):
        target: dict[str, Any] = out
        nested = [v for v in out.values() if isinstance(v, dict)]
        if nested and draw(st.booleans()):
            target = draw(st.sampled_from(nested))
        keys = sorted(target)
        kind = draw(st.sampled_from(["replace", "remove", "add"]))
        if kind == "add" or not keys:
            target[draw(st.text(max_size=10))] = draw(json_values)
        elif kind == "remove":
            del target[draw(st.sampled_from(keys))]
        else:
            target[draw(st.sampled_from(keys))] = draw(json_values)
    return out


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8", "surrogatepass")


def _check_loads_in_range(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    loaded = load_settings()  # never raises
    Settings(**asdict(loaded.settings))  # every field in range (the constructor checks)
    assert loaded.problem is None or ("\n" not in loaded.problem and len(loaded.problem) < 1000)
    assert path.read_bytes() == content


def _valid_settings_bytes() -> bytes:
    save_settings(VALID_SETTINGS)
    return settings_path().read_bytes()


@FUZZ
@given(data=st.data())
def test_any_mutated_settings_file_loads_in_range_and_stays(data: st.DataObject) -> None:
    valid = _valid_settings_bytes()
    _check_loads_in_range(settings_path(), data.draw(byte_mutations(valid)))


@FUZZ
@given(data=st.data())
def test_any_restructured_settings_file_loads_in_range_and_stays(data: st.DataObject) -> None:
    valid = json.loads(_valid_settings_bytes())
    _check_loads_in_range(settings_path(), _dump(data.draw(structural_mutations(valid))))


def _check_scenario(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    try:
        scenario = load_scenario(path)
    except ScenarioError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 1000
    else:
        assert isinstance(scenario, Scenario)
        assert 16 <= scenario.n_ctx <= 1 << 20 and 1 <= scenario.n_batch <= 1 << 20
        assert 0 <= scenario.seed <= 0x7FFFFFFF
        assert all(1 <= step.max_tokens <= 1 << 16 for step in scenario.steps)
    assert path.read_bytes() == content


@FUZZ
@given(data=st.data())
def test_any_mutated_scenario_is_a_scenario_or_a_scenario_error(
    tmp_path: Path, data: st.DataObject
) -> None:
    _check_scenario(tmp_path / "s.json", data.draw(byte_mutations(_dump(VALID_SCENARIO))))


@FUZZ
@given(data=st.data())
def test_any_restructured_scenario_is_a_scenario_or_a_scenario_error(
    tmp_path: Path, data: st.DataObject
) -> None:
    _check_scenario(tmp_path / "s.json", _dump(data.draw(structural_mutations(VALID_SCENARIO))))
