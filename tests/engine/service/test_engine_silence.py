"""An engine process that goes silent or deaf is declared dead, killed and replaced, as a
crashed one is: stopped (SIGSTOP), or unable to read a message. Nothing waits for it for ever.

The silence limit is made short here (a product parameter); the hang guards are generous."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import pytest
from pytestqt.qtbot import QtBot

import engine.service.process
from app.state.engine_client import ProcessEngine
from app.window.main_window import MainWindow
from engine.api.engines import OwnEngine
from engine.api.server import Server, ServerOptions
from engine.api.trees import LocalTrees
from engine.api.worker import ApiWorker
from engine.config.settings import Settings
from engine.core.tree import NodeStatus, Role
from engine.service.client import ProcessClient
from engine.service.process import EngineProcess
from engine.service.protocol import EXIT_UNREADABLE, EngineDied, EngineStarted
from tests.app_fixtures import TIMEOUT, process_gone, send, warnings_shown

# Every test here starts an engine process itself, most without a fixture that says so.
pytestmark = pytest.mark.engine_process

SILENCE_S = 5.0  # short, so the tests do not wait long; a stopped engine is silent for ever


def _started(process: EngineProcess) -> EngineStarted:
    assert process.poll(TIMEOUT), "the engine did not start"
    event = process.recv()
    assert isinstance(event, EngineStarted), event
    return event


class _Unpicklable:
    """Pickles fine; unpickling it raises (as a message from another version would)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_refuse, ("not for this engine",))


def _refuse(why: str) -> None:
    raise TypeError(why)


def test_an_engine_that_cannot_read_a_message_ends_and_is_reported_dead() -> None:
    process = EngineProcess()
    try:
        _started(process)
        with process._send_lock:
            process._conn.send(_Unpicklable())
        assert process.poll(TIMEOUT), "a deaf engine: no death reported"
        died = process.recv()
        assert isinstance(died, EngineDied)
        assert died.exitcode == EXIT_UNREADABLE
        assert "could not read a message" in died.describe()
        assert isinstance(process.recv(), EngineDied)  # and then always
    finally:
        process.shutdown()


def test_a_stopped_engine_is_declared_dead_and_killed() -> None:
    process = EngineProcess(silence_s=SILENCE_S)
    try:
        _started(process)
        assert process.pid is not None
        os.kill(process.pid, signal.SIGSTOP)
        assert process.poll(TIMEOUT), "a silent engine was waited for"
        died = process.recv()
        assert isinstance(died, EngineDied)
        assert died.silent_s is not None and died.silent_s >= SILENCE_S
        assert "stopped answering" in died.describe()
        assert not process.alive
    finally:
        process.shutdown()


def test_an_idle_engine_is_heard_alive_through_its_heartbeat() -> None:
    """Nothing to say for three silence limits: its heartbeats keep it alive."""
    process = EngineProcess(silence_s=SILENCE_S)
    try:
        _started(process)
        assert not process.poll(3 * SILENCE_S)  # no event: heartbeats are not events
        assert process.alive
    finally:
        process.shutdown()


def test_the_api_answers_503_for_a_stopped_engine_then_serves_from_a_new_one(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine.service.process, "SILENCE_S", SILENCE_S)
    own = OwnEngine(tiny_models["dense"], Settings(n_ctx=512, max_tokens=4))
    worker = ApiWorker(lambda: LocalTrees(tmp_path / "api.db"), own)
    worker.start()
    server = Server(worker, lambda: "tiny", ServerOptions(port=0))
    server.start()
    body = {"messages": [{"role": "user", "content": "Name a river."}], "max_tokens": 4}
    try:
        replier = own._replier
        assert isinstance(replier, ProcessClient) and replier.process is not None
        stopped = replier.process.pid
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
            first = client.post("/chat/completions", json=body)
            assert first.status_code == 503, first.text
            assert "stopped answering" in first.json()["error"]["message"]
            assert process_gone(stopped) or not replier.process.alive
            second = client.post("/chat/completions", json=body)
            assert second.status_code == 200, second.text
            assert second.json()["choices"][0]["message"]["content"]
            assert client.get("/models").status_code == 200
    finally:
        server.stop()
        worker.close()
        own.close()


@pytest.fixture
def quick_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.service.process, "SILENCE_S", SILENCE_S)


def test_the_window_replaces_a_stopped_engine_like_a_crashed_one(
    quick_silence: None, qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = warnings_shown(monkeypatch)
    send(qtbot, window, "Hello")
    engine_ = window.engine
    assert isinstance(engine_, ProcessEngine)
    stopped = engine_.pid
    assert stopped is not None
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):  # loaded again, unasked
        os.kill(stopped, signal.SIGSTOP)
    assert process_gone(stopped) and window.replies.engine_pid not in (None, stopped)
    assert len(shown) == 1 and "stopped answering" in shown[0]
    send(qtbot, window, "Are you back?")  # the new engine answers
    assert window.tree.messages()[-1].role is Role.ASSISTANT
    assert window.tree.messages()[-1].status is NodeStatus.COMPLETE


def test_a_reader_waiting_on_a_stopped_engine_returns() -> None:
    """The reader thread's `recv` itself returns (the app's reader blocks in it)."""
    process = EngineProcess(silence_s=SILENCE_S)
    got: list[object] = []
    try:
        _started(process)
        assert process.pid is not None
        reader = threading.Thread(target=lambda: got.append(process.recv()), daemon=True)
        reader.start()
        os.kill(process.pid, signal.SIGSTOP)
        reader.join(TIMEOUT)
        assert got and isinstance(got[0], EngineDied)
    finally:
        process.shutdown()
