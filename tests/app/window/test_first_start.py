"""The first start: the system check, the logs, the self-test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QUrl
from pytestqt.qtbot import QtBot

import app.window.self_test
import app.window.system_check as system_check
from app.window.main_window import MainWindow
from engine.service.process import EngineProcess
from engine.service.protocol import Crash, CrashKind, EngineDied

ROOT = Path(__file__).resolve().parents[3]


def test_missing_x11_libraries_are_named_as_packages_in_one_line(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(system_check.sys, "platform", "linux")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.setattr(system_check, "missing_libraries",
                        lambda _plugin: ["libxcb-icccm.so.4", "libxcb-keysyms.so.1",
                                         "libodd.so.2"])
    found = system_check.problem()
    assert found == ("Arbor's window needs system libraries that are missing: sudo apt "
                     "install libodd.so.2 libxcb-icccm4 libxcb-keysyms1")
    monkeypatch.setattr(system_check, "missing_libraries", lambda _plugin: [])
    assert system_check.problem() is None
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # no X11 plugin in play
    monkeypatch.setattr(system_check, "missing_libraries", lambda _plugin: ["libx.so.1"])
    assert system_check.problem() is None


def test_ldd_reads_what_is_missing_from_a_real_library(tmp_path: Path) -> None:
    plugin = system_check.xcb_plugin()
    assert plugin is not None
    missing = system_check.missing_libraries(plugin)
    assert all(name.endswith(tuple(f".so.{n}" for n in range(10))) for name in missing)
    # What ldd reports missing is exactly what the check reports.
    out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True).stdout
    assert sorted({line.split()[0] for line in out.splitlines() if "not found" in line}) \
        == missing


def test_logs_go_to_a_rotating_file_and_native_crashes_next_to_it(tmp_path: Path) -> None:
    script = ("import logging, faulthandler\n"
              "from app.window.logs import setup_logging\n"
              "folder = setup_logging()\n"
              "logging.getLogger('arbor.test').warning('a line for the log')\n"
              "faulthandler._sigabrt()\n")
    env = {**os.environ, "ARBOR_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode != 0  # it aborted, as a native crash does
    logs = tmp_path / "logs"
    assert "a line for the log" in (logs / "arbor.log").read_text()
    assert "Fatal Python error: Aborted" in (logs / "crash.log").read_text()


@pytest.mark.engine_process
def test_the_engine_process_writes_its_stderr_to_its_log_file(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    engine = EngineProcess(log_file=log)
    engine.send(Crash(CrashKind.ABORT))
    while not isinstance(engine.recv(), EngineDied):
        pass
    engine.shutdown()
    assert "Fatal Python error: Aborted" in log.read_text()


def test_help_opens_the_log_folder(qtbot: QtBot, fake_window: MainWindow,
                                   monkeypatch: pytest.MonkeyPatch,
                                   _arbor_home: Path) -> None:
    opened: list[QUrl] = []
    monkeypatch.setattr("app.window.main_window.QDesktopServices.openUrl",
                        lambda url: opened.append(url) or True)
    fake_window.actions_by_name["log_folder"].trigger()
    assert [url.toLocalFile() for url in opened] == [str(_arbor_home / "logs")]


# The self-test is the app itself (a fake_window, its engine process, the bundled model), in a
# child process: no fixture says so.
@pytest.mark.model
@pytest.mark.window
@pytest.mark.engine_process
@pytest.mark.slow
def test_the_self_test_passes_on_the_bundled_model(tmp_path: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "ARBOR_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "app.window.main", "--self-test"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("arbor self-test:")]
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert any("equals a full reprocess" in ln for ln in lines)
    assert any("session file" in ln for ln in lines) and lines[-1].startswith(
        "arbor self-test: passed")


def test_a_failing_self_test_says_which_step_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(_home: Path, say: object) -> None:
        raise app.window.self_test.SelfTestFailed("the reply after the edit differs: 'a' != 'b'")

    monkeypatch.setattr(app.window.self_test, "_run", broken)
    assert app.window.self_test.run_self_test() == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["arbor self-test: FAILED: the reply after the edit differs: 'a' != 'b'"]
