"""The benchmark's own logic: the cases it builds, its interleaving, its medians and ratios,
its report, and a whole (tiny) run on real llama.cpp. No test here looks at a time's value."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from engine.bench.api_session import Server
from engine.bench.cases import (
    MEASURED,
    SETUP_LAST,
    TURNS,
    Case,
    Conversation,
    rotation,
    turn_words,
)
from engine.bench.limits import checkpoint_throughput, store_over_session, thread_speeds
from engine.bench.main import cli_args
from engine.bench.main import main as bench_main
from engine.bench.models import BenchModel, ModelAbsent, Tokens, find
from engine.bench.report import (
    Record,
    mark_same_text,
    plots,
    summarise,
    table,
    targets,
)
from engine.bench.stats import Spread, ratios
from engine.bench.systems import SETUP, Setup, System, run
from engine.core.memory import MemoryKind
from engine.llm.cpu import logical_cores, physical_cores
from engine.service.scenario import parse_scenario

# --- cases -------------------------------------------------------------------------------


def test_turns_grow_with_the_target_length_and_never_vanish() -> None:
    assert turn_words(3500, 1.3) > turn_words(1024, 1.3) > turn_words(512, 1.3)
    assert turn_words(10, 1.3) >= 8
    with pytest.raises(ValueError):
        turn_words(0, 1.3)


def test_the_last_message_is_edited_in_its_middle_not_at_its_end() -> None:
    conversation = Conversation.of_length(1024, 1.3)
    before, after = conversation.turns[-1].split(" "), conversation.edited_last.split(" ")
    assert after != before and len(after) > len(before)
    assert after[:10] == before[:10] and after[-10:] == before[-10:]


def test_the_scenario_measures_each_case_on_the_operation_it_names() -> None:
    conversation = Conversation.of_length(512, 1.3)
    data = conversation.scenario("model.gguf", n_ctx=4096, n_batch=512)
    scenario = parse_scenario(data)  # a valid replay scenario
    ops = [step.op.value for step in scenario.steps]
    assert ops[:TURNS] == ["send"] * TURNS and SETUP_LAST == TURNS - 1
    expected = {Case.EDIT_LAST: "edit", Case.REGENERATE: "regenerate",
                Case.EDIT_EARLY: "edit", Case.SWITCH_BACK: "send", Case.CONTINUE: "continue",
                Case.WARM_SEND: "send"}
    assert {case: ops[i] for i, case in MEASURED.items()} == expected
    by_case = {case: i for i, case in MEASURED.items()}
    assert ops[by_case[Case.SWITCH_BACK] - 1] == "switch"
    assert ops[by_case[Case.WARM_SEND] - 1] == "warm"
    assert ops[by_case[Case.CONTINUE] - 2: by_case[Case.CONTINUE]] == ["send", "warm"]
    assert scenario.steps[by_case[Case.EDIT_EARLY]].message == 0
    assert set(MEASURED.values()) == set(Case)


def test_every_system_goes_first_equally_often_and_each_round_runs_them_all() -> None:
    systems = ["a", "b", "c", "d"]
    rounds = [rotation(systems, r) for r in range(8)]
    assert all(sorted(order) == systems for order in rounds)
    assert Counter(order[0] for order in rounds) == {s: 2 for s in systems}
    assert rotation([], 3) == []


# --- stats and report --------------------------------------------------------------------


def test_spread_and_same_round_ratios() -> None:
    spread = Spread.of([3.0, 1.0, 2.0, 10.0])
    assert (spread.median, spread.low, spread.high, spread.n) == (2.5, 1.0, 10.0, 4)
    assert ratios([2.0, 9.0], [4.0, 3.0]) == [0.5, 3.0]
    with pytest.raises(ValueError):
        ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        Spread.of([])


def _record(system: str, round_: int, ttft: float, text: str = "same", *, decoded: int = 10,
            case: str = Case.REGENERATE.value, model: str = "m", new: int = 0) -> Record:
    return Record(model=model, system=system, length=100, round=round_, case=case,
                  ttft_ms=ttft, decoded=decoded, text=text, prompt_tokens=100, new_tokens=new)


def test_ratios_pair_each_system_with_the_reprocess_of_its_own_round() -> None:
    records = mark_same_text([
        _record("reprocess", 0, 1000.0), _record("reprocess", 1, 4000.0),
        _record("arbor", 0, 100.0), _record("arbor", 1, 200.0),
    ])
    cell = summarise(records)[("m", 100, Case.REGENERATE.value, "arbor")]
    assert cell.ratio is not None and sorted([cell.ratio.low, cell.ratio.high]) == [0.05, 0.1]
    assert cell.ttft.median == 150.0 and cell.differs == 0


def test_a_system_whose_text_differs_is_flagged_never_hidden() -> None:
    records = mark_same_text([
        _record("reprocess", 0, 1000.0, "the reply"),
        _record("plain", 0, 500.0, "another reply"),
        _record("arbor", 0, 50.0, "the reply"),
    ])
    assert [r.same_text for r in records] == [True, False, True]
    text = table(records, ["arbor", "reprocess", "plain"], {})
    row = next(line for line in text.splitlines() if Case.REGENERATE.label in line)
    cells = row.split(" | ")
    assert "differs in 1/1" in cells[-1] and "differs" not in cells[-3]


def test_targets_compare_decoded_tokens_and_the_plain_apps_time_at_the_longest_length() -> None:
    records = [
        _record("arbor", 0, 100.0, decoded=70, case=Case.SWITCH_BACK.value, new=10),
        _record("plain", 0, 3000.0, case=Case.SWITCH_BACK.value),
        _record("arbor", 0, 100.0, decoded=4, case=Case.REGENERATE.value),
        _record("plain", 0, 1000.0, case=Case.REGENERATE.value),
    ]
    verdicts = {v.case: v for v in targets(records, speed_kinds={"m": True})}
    switch, regenerate = verdicts[Case.SWITCH_BACK.value], verdicts[Case.REGENERATE.value]
    assert (switch.allowed, switch.decode_met, switch.speed_met) == (74, True, True)
    assert switch.speedup is not None and switch.speedup.median == 30.0
    assert (regenerate.decode_met, regenerate.speed_met) == (True, False)
    dense = targets(records, speed_kinds={"m": False})
    assert all(v.speed_met is None for v in dense)


def test_plots_are_written_one_per_case(tmp_path: Path) -> None:
    records = [_record(s, 0, t, case=c.value) for c in Case
               for s, t in (("reprocess", 900.0), ("arbor", 90.0))]
    written = plots(records, ["arbor", "reprocess"], {}, tmp_path)
    assert sorted(p.name for p in written) == sorted(f"ttft-{c.value}.png" for c in Case)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
    # The API session alone (--lengths ""): no comparison, so no plot, and no error.
    assert plots([], ["arbor"], {}, tmp_path / "none") == []


# --- models ------------------------------------------------------------------------------


def test_an_unknown_or_missing_model_is_named_as_absent(tmp_path: Path) -> None:
    with pytest.raises(ModelAbsent, match="unknown model"):
        find("nonesuch", tmp_path)
    with pytest.raises(ModelAbsent, match="not a file"):
        find(str(tmp_path / "gone.gguf"), tmp_path)


def test_a_gguf_path_is_a_model_of_its_own_kind(tiny_models: dict[str, Path],
                                                tmp_path: Path) -> None:
    model = find(str(tiny_models["recurrent"]), tmp_path)
    assert model.kind is MemoryKind.RECURRENT and model.speed_target


# --- a whole run on the tiny models ------------------------------------------------------


@pytest.mark.parametrize("kind", ["dense", "recurrent"])
def test_every_system_replays_every_case_and_arbor_says_what_the_reprocess_says(
    tiny_models: dict[str, Path], kind: str
) -> None:
    path = tiny_models[kind]
    tokens = Tokens(path)
    try:
        conversation = Conversation.of_length(200, tokens.per_word())
    finally:
        tokens.close()
    setup = Setup(path, n_ctx=1024, n_batch=64, n_threads=2)
    results = {system: run(system, setup, conversation) for system in System}
    for measures in results.values():
        assert set(measures) == {SETUP, *(c.value for c in Case)}
    arbor, full = results[System.ARBOR], results[System.REPROCESS]
    assert {c: arbor[c].text for c in full} == {c: full[c].text for c in full}  # the promise
    for case in (Case.REGENERATE, Case.SWITCH_BACK, Case.WARM_SEND, Case.CONTINUE):
        assert arbor[case.value].decoded < full[case.value].decoded / 2, case
    assert full[Case.SWITCH_BACK.value].decoded == full[Case.SWITCH_BACK.value].prompt_tokens
    plain = results[System.PLAIN][Case.REGENERATE.value].decoded
    if kind == "dense":
        assert plain <= 1  # its prefix reuse: the same prompt again
    else:  # a recurrent state cannot be cut back: llama-cpp-python reads it all again
        assert plain >= full[Case.REGENERATE.value].decoded - 8
    # llama-server, built from the vendored sources, reports what it decoded: the same
    # prompt again costs it a token on a dense cache, a few from its checkpoint just before
    # the prompt's end on a recurrent one.
    server = results[System.LLAMA_SERVER][Case.REGENERATE.value].decoded
    assert server <= 1 if kind == "dense" else 1 <= server < full[Case.REGENERATE.value].decoded / 2


def test_the_command_writes_json_markdown_and_plots(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARBOR_HOME", str(tmp_path / "home"))
    args = cli_args(["--models", str(tiny_models["hybrid"]), "--lengths", "120,200",
                     "--rounds", "2", "--no-limits", "--session-lengths", "150",
                     "--out", str(tmp_path / "out")])
    assert bench_main(args) == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["machine"]["logical_cores"] >= 1 and data["rounds"] == 2
    records = data["records"]
    assert len(records) == 2 * 2 * len(System) * (len(Case) + 1)  # lengths, rounds, ...
    assert all(r["same_text"] for r in records if r["system"] in ("arbor", "reprocess"))
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "## Targets" in markdown and Case.SWITCH_BACK.label in markdown
    assert len(list((tmp_path / "out").glob("ttft-*.png"))) == len(Case)
    assert all(set(m) == {"name", "title", "kind", "file", "swa_full"} and "/" not in m["file"]
               for m in data["models"])  # models named, not the machine's paths
    session = data["session"]
    assert session["absent"] == {}
    assert {m["server"] for m in session["measures"]} == {s.value for s in Server}
    assert "A SillyTavern-like session over the API" in markdown


# --- engine limits -----------------------------------------------------------------------


def test_checkpoint_throughput_measures_real_state_bytes(tiny_models: dict[str, Path]) -> None:
    model = BenchModel("tiny", "tiny dense", MemoryKind.DENSE, tiny_models["dense"])
    figure = checkpoint_throughput(model, tokens=200, n_threads=2, rounds=2)
    assert figure.tokens == 200 and figure.bytes > 200  # a state grows with its tokens
    assert figure.capture_share >= 0 and figure.copy_mb_s > 0


def test_the_store_stays_within_its_budgets_over_a_long_branching_session(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARBOR_HOME", str(tmp_path))
    model = BenchModel("tiny", "tiny recurrent", MemoryKind.RECURRENT,
                       tiny_models["recurrent"])
    ram, disk = 1 << 20, 2 << 20
    figures = store_over_session(model, n_threads=2, branches=9, ram_budget=ram,
                                 disk_budget=disk)
    assert figures["trace"] and figures["final"]["created"] > 0
    assert figures["final"]["restored"] > 0  # the switches back used checkpoints
    assert figures["peak_ram_bytes"] <= ram and figures["peak_disk_bytes"] <= disk


def test_thread_speeds_cover_every_count_quiet_and_busy(tiny_models: dict[str, Path]) -> None:
    figures = thread_speeds(tiny_models["dense"], [1, 2], prompt=64, generate=4, rounds=1)
    assert {(f.threads, f.busy) for f in figures} == {(1, False), (2, False), (1, True),
                                                      (2, True)}
    assert all(f.prefill_tok_s > 0 and f.generate_tok_s > 0 for f in figures)


def test_physical_cores_count_hyper_threads_once() -> None:
    two_cores_four_threads = "\n".join(
        f"processor\t: {n}\nphysical id\t: 0\ncore id\t\t: {n % 2}\n" for n in range(4))
    assert physical_cores(two_cores_four_threads) == min(2, logical_cores())
    assert physical_cores("processor : 0\n") == logical_cores()  # says nothing: logical
