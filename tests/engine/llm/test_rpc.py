"""llama.cpp RPC workers on loopback: the same words as the CPU, checkpoints restored on the
workers, and a worker that is gone or dies costs a message, never a conversation.

Workers are `arbor-engine rpc-worker`'s program, started by the fixture on free ports of
127.0.0.1 and stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.window.main_window import MainWindow
from engine.config.endpoints import parse_endpoint
from engine.config.params import CacheMode, ContextParams, FlashAttention, RuntimeSettings
from engine.core.tree import NodeStatus, Role
from engine.llm.rpc import build_supports_rpc, probe, worker_program
from engine.service.replay import replay
from engine.service.scenario import parse_scenario
from tests.app_fixtures import TIMEOUT, free_port, send

ROOT = Path(__file__).resolve().parents[3]
STEPS: list[dict[str, Any]] = [
    {"op": "send", "text": "Name three rivers of Europe.", "max_tokens": 24},
    {"op": "send", "text": "Which is the longest?", "max_tokens": 24},
    {"op": "edit", "message": 0, "text": "Name three rivers of Africa.", "max_tokens": 24},
    {"op": "regenerate", "max_tokens": 24},
    {"op": "switch", "message": 0, "variant": 0},
    {"op": "send", "text": "And which is the shortest?", "max_tokens": 24},
]

pytestmark = [
    pytest.mark.skipif(
        not build_supports_rpc(),
        reason="this llama-cpp-python build has no RPC backend (`make` builds it with RPC on)"),
    # Layers on RPC workers run in an engine process (a dying worker aborts its process).
    pytest.mark.engine_process,
]


class Workers:
    def __init__(self, program: Path, count: int) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.endpoints: list[str] = []
        for _ in range(count):
            port = free_port()
            self.processes.append(subprocess.Popen(
                [str(program), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            self.endpoints.append(f"127.0.0.1:{port}")
        for endpoint in self.endpoints:  # a hang guard, not a speed claim
            for _ in range(600):
                if probe(parse_endpoint(endpoint), timeout=1) is None:
                    break
                time.sleep(0.05)

    def kill(self, index: int) -> None:
        os.kill(self.processes[index].pid, signal.SIGKILL)
        self.processes[index].wait()

    def busy_seconds(self, index: int) -> float:
        fields = Path(f"/proc/{self.processes[index].pid}/stat").read_text().split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="session")
def rpc_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worker program, built once per test run from the sdist `make` keeps."""
    return worker_program(tmp_path_factory.mktemp("rpc"))


@pytest.fixture
def workers(rpc_program: Path) -> Iterator[Workers]:
    running = Workers(rpc_program, 2)
    yield running
    running.stop()


def _scenario(model: Path) -> Any:
    return parse_scenario({"model": str(model), "n_ctx": 2048, "n_batch": 512, "seed": 3,
                           "sampling": {"temperature": 0.0}, "system": "Be brief.",
                           "steps": STEPS})


def test_every_layer_on_two_workers_gives_the_cpus_words_and_restores_there(
    workers: Workers, smollm2_path: Path
) -> None:
    scenario = _scenario(smollm2_path)
    remote = replay(scenario, rpc_workers=tuple(workers.endpoints))
    assert remote["model"]["backend"] == "CPU + 2 RPC workers"
    assert remote["engine"] == "process"
    # The reference: the CPU alone, flash attention on as the workers need, every prompt
    # decoded whole.
    cpu = RuntimeSettings(n_ctx=2048, n_batch=512,
                          context=ContextParams(flash_attn=FlashAttention.ON))
    reference = replay(scenario, cache=CacheMode.NONE, runtime_settings=cpu)
    assert [s["text"] for s in remote["steps"]] == [s["text"] for s in reference["steps"]]
    assert any(s["source"] == "checkpoint" for s in remote["steps"])
    assert remote["checkpoints"]["restored"] > 0


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ARBOR_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT / 1000)


def _scenario_file(tmp_path: Path, model: Path, steps: list[dict[str, Any]]) -> Path:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({"model": str(model), "n_ctx": 2048, "steps": steps}))
    return path


def test_a_worker_address_with_nothing_listening_is_one_line_and_exit_2(
    tmp_path: Path, smollm2_path: Path
) -> None:
    port = free_port()  # closed again: nothing listens there
    scenario = _scenario_file(tmp_path, smollm2_path, STEPS[:1])
    done = _cli("replay", str(scenario), "--rpc", f"127.0.0.1:{port}", home=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "does not answer" in lines[0]
    assert "Traceback" not in done.stderr


def test_a_worker_killed_mid_reply_is_one_line_and_exit_2(
    tmp_path: Path, smollm2_path: Path, workers: Workers
) -> None:
    long = [{"op": "send", "text": f"Tell me a long story, part {i}.", "max_tokens": 400}
            for i in range(6)]
    scenario = _scenario_file(tmp_path, smollm2_path, long)
    env = {**os.environ, "ARBOR_HOME": str(tmp_path)}
    running = subprocess.Popen(
        [sys.executable, "-m", "engine", "replay", str(scenario), "--rpc",
         ",".join(workers.endpoints)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    while workers.busy_seconds(1) < 1.0 and running.poll() is None:  # it is computing
        time.sleep(0.05)
    workers.kill(1)
    _out, err = running.communicate(timeout=TIMEOUT / 1000)
    assert running.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and workers.endpoints[1] in lines[-1] and "RPC worker" in lines[-1]


@pytest.fixture
def rpc_window(qtbot: QtBot, smol_window: MainWindow, workers: Workers) -> MainWindow:
    with qtbot.waitSignal(smol_window.model_ready, timeout=TIMEOUT):
        smol_window.models.apply_settings(replace(smol_window.settings, max_tokens=400,
                                                  rpc_workers=tuple(workers.endpoints)))
    return smol_window


def test_in_the_window_a_worker_that_dies_costs_no_word_and_the_next_reply_runs(
    qtbot: QtBot, rpc_window: MainWindow, workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))
    window = rpc_window
    assert window.replies.model is not None
    assert window.replies.model.backend == "CPU + 2 RPC workers"

    def kill(*_args: object) -> None:
        window.text_shown.disconnect(kill)
        workers.kill(0)

    window.text_shown.connect(kill)
    window.composer.setPlainText("Tell me a long story.")
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):  # loaded again
        qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    reply = window.tree.messages()[-1]
    assert reply.role is Role.ASSISTANT and reply.status is NodeStatus.INTERRUPTED
    assert window.store.load(window.current or 0).messages()[-1].status is \
        NodeStatus.INTERRUPTED
    assert len(shown) == 1 and "Loading the model again" in shown[0]
    model = window.replies.model
    assert model is not None and model.backend == "CPU + 1 RPC worker"
    assert any(workers.endpoints[0] in notice and "does not answer" in notice
               for notice in model.notices)
    assert workers.endpoints[0] in window.statusBar().currentMessage()
    send(qtbot, window, "Are you still there?")
    assert window.tree.messages()[-1].status is NodeStatus.COMPLETE


def test_in_the_window_an_address_with_nothing_listening_is_left_out_and_named(
    qtbot: QtBot, smol_window: MainWindow, workers: Workers
) -> None:
    window = smol_window
    dead = f"127.0.0.1:{free_port()}"
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):
        window.models.apply_settings(replace(window.settings, max_tokens=8,
                                             rpc_workers=(workers.endpoints[0], dead)))
    model = window.replies.model
    assert model is not None and model.backend == "CPU + 1 RPC worker"
    assert dead in window.statusBar().currentMessage()
    send(qtbot, window, "Hello over the network")
    assert window.tree.messages()[-1].status is NodeStatus.COMPLETE


def test_in_the_window_a_reload_keeps_workers_the_loaded_model_is_on(
    qtbot: QtBot, rpc_window: MainWindow
) -> None:
    """A worker serves one client at a time, and the loaded model holds its connection
    while the new one is placed: the probe must not take that for a silent worker."""
    window = rpc_window
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):
        window.models.apply_settings(replace(window.settings, n_ctx=1024))
    model = window.replies.model
    assert model is not None and model.backend == "CPU + 2 RPC workers", model.notices
