"""The benchmark's figures in the docs come from its results files, never by hand: results.md
and docs/benchmark.md's generated parts are what the one renderer makes of results.json now.
No model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.bench.docs import END, PAGE, begin_line, render
from engine.bench.main import results_markdown
from engine.bench.models import BenchModel
from engine.bench.report import Record
from engine.bench.systems import System
from engine.core.memory import MemoryKind

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "resources" / "bench"


@pytest.mark.parametrize("folder", [RESULTS, RESULTS / "swa-full"], ids=["main", "swa-full"])
def test_results_md_is_what_the_renderer_makes_of_results_json(folder: Path) -> None:
    data = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    assert (folder / "results.md").read_text(encoding="utf-8") == results_markdown(data)


def test_the_benchmark_page_is_fresh() -> None:
    page = (ROOT / PAGE).read_text(encoding="utf-8")
    assert begin_line("resources/bench/results.json") in page  # its main table is generated
    assert render(page) == page, "docs/benchmark.md is stale: run python -m engine.bench.docs"


def test_a_new_run_changes_the_generated_part_and_only_it(tmp_path: Path) -> None:
    source = "results.json"
    shutil.copy(RESULTS / "results.json", tmp_path / source)
    page = f"# Prose before\n\n{begin_line(source)}\n\nold table\n\n{END}\n\nProse after.\n"
    fresh = render(page, tmp_path)
    assert "old table" not in fresh and "| model | tokens | case |" in fresh
    assert fresh.startswith("# Prose before\n") and fresh.endswith(f"{END}\n\nProse after.\n")
    assert render(fresh, tmp_path) == fresh  # rendering is stable

    data = json.loads((tmp_path / source).read_text(encoding="utf-8"))
    data["records"][0]["ttft_ms"] *= 1000  # one figure of a new run
    (tmp_path / source).write_text(json.dumps(data), encoding="utf-8")
    assert render(fresh, tmp_path) != fresh


def test_a_generated_part_without_its_end_is_refused() -> None:
    with pytest.raises(ValueError, match="no end line"):
        render(f"{begin_line('resources/bench/results.json')}\n\ntable\n")


def test_a_run_writes_results_md_with_the_same_renderer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.bench.main as bench

    data = json.loads((RESULTS / "results.json").read_text(encoding="utf-8"))
    monkeypatch.setattr(bench, "machine", lambda: data["machine"])  # no llama.cpp here
    models = [BenchModel(m["name"], m["title"], MemoryKind(m["kind"]), Path(m["file"]),
                         m["swa_full"]) for m in data["models"]]
    results = bench.Results(models, {}, data["lengths"], data["rounds"], data["threads"],
                            [System(s) for s in data["systems"]],
                            [Record(**r) for r in data["records"]], data["limits"])
    results.write(tmp_path)
    written = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert written["systems"] == data["systems"] and System.LLAMA_SERVER in data["systems"]
    assert written["targets"] == data["targets"]
    md = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert md == results_markdown(written) == (RESULTS / "results.md").read_text(encoding="utf-8")
