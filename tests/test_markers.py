"""The markers tests/conftest.py gives each test from what it needs: checked on the rule, on
this module's own tests, and on real modules of the suite collected in a child pytest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FAST_EXCLUDES, MARKER_FIXTURES, markers_for

ROOT = Path(__file__).resolve().parents[1]
NEEDS = frozenset(MARKER_FIXTURES)


def _needs(request: pytest.FixtureRequest) -> set[str]:
    return {mark.name for mark in request.node.iter_markers()} & NEEDS


@pytest.mark.parametrize(("fixtures", "expected"), [
    ((), set()),
    (("tmp_path", "monkeypatch", "capsys"), set()),
    (("smollm2_path",), {"model"}),
    (("make_runtime", "tmp_path"), {"model"}),
    (("qtbot",), {"window"}),
    (("qapp",), {"window"}),
    # The window fixtures' closure, as pytest computes it: they reach the model and Qt.
    (("window", "qtbot", "tiny_models", "smollm2_path", "engine_calls"),
     {"model", "window", "engine_process"}),
    (("fake_window", "fake_engine", "qtbot"), {"window"}),
    (("offline_window", "fake_engine", "qtbot"), {"window"}),
    (("smol_window", "qtbot", "smollm2_path"), {"model", "window", "engine_process", "slow"}),
    (("gemma_path",), {"model", "slow"}),
])
def test_the_rule_marks_what_the_fixtures_need(
    fixtures: tuple[str, ...], expected: set[str]
) -> None:
    assert markers_for(fixtures, set()) == expected
    assert markers_for(fixtures, {"model"}) == expected - {"model"}  # already marked


def test_make_test_fast_leaves_out_what_the_markers_say() -> None:
    makefile = (ROOT / "Makefile").read_text()
    expression = " and ".join(f"not {marker}" for marker in FAST_EXCLUDES)
    assert f'-m "{expression}"' in makefile.split("\ntest-fast:")[1].split("\n\n")[0]
    assert set(FAST_EXCLUDES) <= NEEDS


def test_a_test_that_needs_nothing_is_not_marked(request: pytest.FixtureRequest) -> None:
    assert _needs(request) == set()


def test_a_test_given_the_model_is_marked_model(
    request: pytest.FixtureRequest, smollm2_path: Path
) -> None:
    assert _needs(request) == {"model"}


_REPORT = """
import json, sys, pytest

class Report:
    def pytest_collection_finish(self, session):
        marks = {item.nodeid: sorted({m.name for m in item.iter_markers()})
                 for item in session.items}
        print("MARKS " + json.dumps(marks))

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]],
                     plugins=[Report()]))
"""


def test_real_tests_are_marked_by_what_they_use() -> None:
    """Collected as `make test` collects them: the window on a real engine, a window on the
    fake engine, a widget alone, pure tests, and tests marked by hand where no fixture tells."""
    window = "tests/app/window/test_app.py"
    fake = "tests/app/state/test_controller.py"
    view = "tests/app/chat/test_chat_view.py"
    start = "tests/app/window/test_first_start.py"
    pure = "tests/engine/core/test_tree.py"
    done = subprocess.run([sys.executable, "-c", _REPORT, window, fake, view, start, pure],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("MARKS "))
    marks = {nodeid: set(names) & NEEDS for nodeid, names in json.loads(line[6:]).items()}

    def of(path: str, name: str) -> set[str]:
        return marks[f"{path}::{name}"]

    assert of(window, "test_send_streams_a_reply_and_saves_it") == {
        "model", "window", "engine_process"}
    assert of(fake, "test_the_controller_answers_persists_and_undoes_without_any_widget") \
        == {"window"}
    assert of(fake, "test_every_action_is_in_one_table_with_unique_names_and_keys") == set()
    assert of(view, "test_long_code_lines_wrap_inside_the_bubble") == {"window"}  # qapp
    assert of(view, "test_model_data_roles_and_lookups") == set()
    assert of(start, "test_the_engine_process_writes_its_stderr_to_its_log_file") == {
        "engine_process"}
    assert of(start, "test_the_self_test_passes_on_the_bundled_model") == {
        "model", "window", "engine_process", "slow"}
    assert all(not found for nodeid, found in marks.items() if nodeid.startswith(pure))
    # What `make test-fast` runs: nothing from the window's module, all of the core's.
    fast = {nodeid for nodeid, found in marks.items() if not found & set(FAST_EXCLUDES)}
    assert not any(nodeid.startswith(window) for nodeid in fast)
    assert {nodeid for nodeid in marks if nodeid.startswith(pure)} <= fast
