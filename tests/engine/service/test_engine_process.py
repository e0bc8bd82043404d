"""The engine in its own process: whatever kills it, the window stays, the conversation is
saved, and the engine comes back (or, if it keeps dying, stops trying and says so)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

import engine.service.process
from app.state.engine_client import ProcessEngine
from app.state.replies import EXPORT_LOST, MAX_RESTARTS
from app.window.main_window import MainWindow
from engine.core.results import ReplyReport, Source
from engine.core.tree import NodeStatus, Role
from engine.service.protocol import (
    Crash,
    CrashKind,
    ExportDone,
    ExportRequest,
    GenerateRequest,
    Request,
)
from engine.storage.transfer import FileFormat
from tests.app_fixtures import TIMEOUT, process_gone, send, warnings_shown

# Engine processes started, crashed and killed, several without a fixture.
pytestmark = pytest.mark.engine_process

ROOT = Path(__file__).resolve().parents[3]
LONG = " ".join(f"Line {i}: the river carries silt to the delta and the sea." for i in range(120))


def _engine(window: MainWindow) -> ProcessEngine:
    assert isinstance(window.engine, ProcessEngine)
    return window.engine


def _kill_when(qtbot: QtBot, window: MainWindow, signal_: object, text: str) -> int:
    """Send `text`; SIGKILL the engine the first time `signal_` fires; wait for the
    reload. Returns the dead engine's pid."""
    engine = _engine(window)
    dead = engine.pid
    assert dead is not None

    def kill(*_args: object) -> None:
        signal_.disconnect(kill)  # type: ignore[attr-defined]
        engine.kill()

    signal_.connect(kill)  # type: ignore[attr-defined]
    window.composer.setPlainText(text)
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):  # loaded again
        qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    return dead


def test_the_engine_killed_mid_prefill_costs_no_word_and_comes_back(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = warnings_shown(monkeypatch)
    send(qtbot, window, "Hello")
    before = [(n.role, n.text) for n in window.tree.messages()]
    dead = _kill_when(qtbot, window, window.replies.preparing, LONG)
    assert process_gone(dead) and window.replies.engine_pid not in (None, dead)
    assert len(shown) == 1 and "killed" in shown[0] and "Loading the model again" in shown[0]
    assert "Traceback" not in shown[0]
    # The user message is kept, the reply that never said a word is not.
    assert [(n.role, n.text) for n in window.tree.messages()] == [*before, (Role.USER, LONG)]
    stored = window.store.load(window.current or 0)
    assert [(n.role, n.text) for n in stored.messages()] == [*before, (Role.USER, LONG)]
    assert window.replies.streaming is None and window.send_button.text() == "Send"
    send(qtbot, window, "Are you back?")  # the new engine answers
    assert window.tree.messages()[-1].role is Role.ASSISTANT


def test_the_engine_killed_mid_reply_keeps_the_reply_interrupted_and_continuable(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = warnings_shown(monkeypatch)
    # A fixed seed: the tiny random model says something under it (a fresh seed may not).
    # A reply as long as the context allows, so that it is still being written when the
    # window shows its first words and kills the engine (400 tokens were once all written
    # before a busy machine's window got there).
    window.models.apply_settings(replace(window.settings, max_tokens=4000, seed=7))
    _kill_when(qtbot, window, window.text_shown, "Tell me a long story.")
    reply = window.tree.messages()[-1]
    assert reply.role is Role.ASSISTANT and reply.status is NodeStatus.INTERRUPTED and reply.text
    saved = window.store.load(window.current or 0).messages()[-1]
    assert (saved.id, saved.status) == (reply.id, NodeStatus.INTERRUPTED)
    assert saved.text and reply.text.startswith(saved.text)  # saved as it grew
    assert "Continue" in shown[0]
    partial = reply.text
    window.models.apply_settings(replace(window.settings, max_tokens=40))
    with qtbot.waitSignal(window.reply_finished, timeout=TIMEOUT):
        window.controller.continue_reply()
    assert reply.text.startswith(partial) and reply.status is NodeStatus.COMPLETE


def _edit_once_a_reply_streams(window: MainWindow, then: Callable[[], None]) -> None:
    """Ask, then as soon as a second reply is under way (streaming, whether or not it has
    said a word yet: a tiny random model may say nothing) edit the first question: the edit
    waits for the reply to stop. `then` runs right after the edit is submitted."""
    window.models.apply_settings(replace(window.settings, max_tokens=400))
    asked = window.tree.messages()[0]

    def edit() -> None:
        if window.replies.streaming is None:
            return
        window.replies.streaming_changed.disconnect(edit)
        window.controller.edit(asked.id, "First question, asked better")
        assert window.replies.streaming is not None  # it waits on the reply
        then()

    window.replies.streaming_changed.connect(edit)
    window.composer.setPlainText("Tell me a long story.")


def _edit_during_a_reply_then_kill(qtbot: QtBot, window: MainWindow) -> None:
    """Ask, then while a second reply streams edit the first question (the edit waits for
    the reply to stop) and kill the engine before the reply has stopped."""
    send(qtbot, window, "First question")
    _edit_once_a_reply_streams(window, _engine(window).kill)
    qtbot.keyClick(window.composer, Qt.Key.Key_Return)


def test_an_edit_waiting_on_a_reply_when_the_engine_dies_is_answered_after_the_reload(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = warnings_shown(monkeypatch)
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):
        _edit_during_a_reply_then_kill(qtbot, window)
    # Loaded again: the edit runs and is answered by the new engine.
    qtbot.waitUntil(lambda: len(window.tree.messages()) == 2
                    and window.tree.messages()[0].text == "First question, asked better"
                    and window.tree.messages()[1].status is NodeStatus.COMPLETE,
                    timeout=TIMEOUT)
    path = window.tree.messages()
    assert path[0].text == "First question, asked better"
    assert path[1].role is Role.ASSISTANT
    stored = window.store.load(window.current or 0)
    assert [n.text for n in stored.messages()] == [n.text for n in path]
    assert len(shown) == 1


def test_an_edit_whose_answer_had_not_begun_when_the_engine_died_is_answered_after_the_reload(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: the reply stops, the waiting edit runs and its answer is sent, and
    only then does the engine die, before the answer said a word."""
    shown = warnings_shown(monkeypatch)
    send(qtbot, window, "First question")
    asked = window.tree.messages()[0]
    engine = _engine(window)
    send_request = engine.send

    def die_as_the_edits_answer_is_asked(request: Request | Crash) -> None:
        # The engine dies as the request is sent, so it cannot say a word of the answer
        # first (killed once the window saw it streaming, a busy machine let it say one).
        if isinstance(request, GenerateRequest) and window.tree.messages()[0].id != asked.id:
            monkeypatch.setattr(engine, "send", send_request)
            engine.kill()
        send_request(request)

    _edit_once_a_reply_streams(
        window, lambda: monkeypatch.setattr(engine, "send", die_as_the_edits_answer_is_asked))
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):
        qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(window.tree.messages()) == 2
                    and window.tree.messages()[0].text == "First question, asked better"
                    and window.tree.messages()[1].status is NodeStatus.COMPLETE,
                    timeout=TIMEOUT)
    path = window.tree.messages()
    assert path[1].role is Role.ASSISTANT
    stored = window.store.load(window.current or 0)
    assert [n.text for n in stored.messages()] == [n.text for n in path]
    assert len(shown) == 1 and "saved" not in shown[0]  # nothing of the answer to keep


def test_an_edit_waiting_when_the_engine_is_given_up_is_saved_unanswered(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = warnings_shown(monkeypatch)
    monkeypatch.setattr(window.replies, "_deaths", MAX_RESTARTS - 1)  # the last chance
    _edit_during_a_reply_then_kill(qtbot, window)
    qtbot.waitUntil(lambda: not window.engine.running, timeout=TIMEOUT)
    path = window.tree.messages()
    assert [(n.role, n.text) for n in path] == [(Role.USER, "First question, asked better")]
    stored = window.store.load(window.current or 0)
    assert [n.text for n in stored.messages()] == ["First question, asked better"]
    assert len(shown) == 1 and "Your edit is saved" in shown[0]
    assert window.replies.streaming is None


def test_a_session_export_the_engine_dies_under_is_reported_and_leaves_no_partial_file(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shown = warnings_shown(monkeypatch)
    send(qtbot, window, "Hello")
    engine = _engine(window)
    send_request = engine.send
    target = tmp_path / "exports" / "session.arbor"
    target.parent.mkdir()
    # What a killed engine leaves of the file it was writing: the atomic write's temporary.
    partial = target.parent / f".{target.name}.k1ll3d.tmp"

    def die_as_the_export_is_sent(request: Request | Crash) -> None:
        if isinstance(request, ExportRequest):
            monkeypatch.setattr(engine, "send", send_request)
            partial.write_bytes(b"PK\x03\x04 half a zip")
            engine.kill()  # SIGKILL: the engine runs not one more line
        send_request(request)

    monkeypatch.setattr(engine, "send", die_as_the_export_is_sent)
    with (qtbot.waitSignal(window.model_ready, timeout=TIMEOUT),
          qtbot.waitSignal(window.files.export_finished, timeout=TIMEOUT) as finished):
        window.files.export_current(target, FileFormat.NATIVE)
    done = finished.args[0]
    assert isinstance(done, ExportDone) and done.error == EXPORT_LOST
    assert len(shown) == 1 and "killed" in shown[0]  # one message says it all
    assert "session.arbor was not exported" in shown[0]
    assert list(target.parent.iterdir()) == []  # neither the file nor a part of it
    # The engine is back: the export works.
    with qtbot.waitSignal(window.files.export_finished, timeout=TIMEOUT) as finished:
        window.files.export_current(target, FileFormat.NATIVE)
    assert finished.args[0].error is None and target.exists()


def test_llama_cpp_aborting_is_reported_and_the_engine_reloads(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = warnings_shown(monkeypatch)
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):
        _engine(window).send(Crash(CrashKind.ABORT))
    assert len(shown) == 1 and "llama.cpp aborted" in shown[0]
    send(qtbot, window, "Still here?")
    assert window.tree.messages()[-1].role is Role.ASSISTANT


def test_an_engine_that_dies_on_every_start_ends_in_a_message_not_a_loop(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch,
    tiny_models: dict[str, Path],
) -> None:
    shown = warnings_shown(monkeypatch)
    monkeypatch.setattr(engine.service.process, "child_main",
                        __import__("tests.engine_faults").engine_faults.abort_at_start)
    _engine(window).send(Crash(CrashKind.KILL))
    qtbot.waitUntil(lambda: not window.engine.running, timeout=TIMEOUT)
    assert len(shown) == MAX_RESTARTS
    assert f"stopped {MAX_RESTARTS} times in a row" in shown[-1] and "Ctrl+M" in shown[-1]
    assert window.replies.model is None
    window.composer.setPlainText("Anyone?")  # the window still works: it says why not
    qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    assert "loading" in window.statusBar().currentMessage()
    monkeypatch.undo()  # a working engine again: choosing a model starts it
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):
        window.models.load_model(str(tiny_models["dense"]))
    send(qtbot, window, "Back?")
    assert window.tree.messages()[-1].role is Role.ASSISTANT


def test_an_engine_outlives_no_window_killed_with_sigkill(tmp_path: Path) -> None:
    """The window's process dies without a word: its engine notices and exits."""
    script = textwrap.dedent("""
        import sys, time
        from PySide6.QtWidgets import QApplication
        from app.state.engine_client import ProcessEngine
        app = QApplication([])
        engine = ProcessEngine()
        print(engine.pid, flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "ARBOR_HOME": str(tmp_path)}
    owner = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    child = int(owner.stdout.readline())
    assert not process_gone(child)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    for _ in range(600):  # a hang guard, not a speed claim: it exits as soon as it reads EOF
        if process_gone(child) or _zombie(child):
            break
        time.sleep(0.1)
    assert process_gone(child) or _zombie(child)


def _zombie(pid: int) -> bool:
    """Exited, waiting for a parent that is gone to reap it (init reaps it soon)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _stats(window: MainWindow) -> dict[str, int]:
    usage = window.replies.usage
    return {k: v for k, v in usage.stats if isinstance(v, int)} if usage is not None else {}


def test_disk_tier_checkpoints_outlive_the_engine_and_serve_the_next_one(
    qtbot: QtBot, smol_window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoints a killed engine spilled to disk are offered to the engine that
    replaces it: the first prepare after the restart restores the prompt-end state instead
    of decoding the long message again."""
    shown = warnings_shown(monkeypatch)
    window = smol_window
    # 16 MiB of RAM holds less than one state of this long prompt: the rest spills.
    window.models.apply_settings(replace(window.settings, checkpoint_ram_mib=16, max_tokens=8))
    send(qtbot, window, LONG[:3000])
    qtbot.waitUntil(lambda: _stats(window).get("disk_count", 0) > 0, timeout=TIMEOUT)
    first = window.replies.last_reply
    assert first is not None and first.prompt_tokens > 600

    reports: list[ReplyReport] = []
    window.replies.warmed.connect(lambda warmed: reports.append(warmed.report))
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):
        _engine(window).kill()
    assert len(shown) == 1 and "killed" in shown[0]
    send(qtbot, window, "And then?")
    assert window.replies.last_reply is not None
    reports.append(window.replies.last_reply)
    # The new engine's first prepare (a warm-up, or the reply itself) restored a state from
    # disk that covers most of the long message.
    restored = [r for r in reports if r.source is Source.CHECKPOINT]
    assert restored, [(r.source, r.decoded_tokens) for r in reports]
    assert (restored[0].checkpoint_pos or 0) > first.prompt_tokens // 2
    assert restored[0].decoded_tokens < first.prompt_tokens // 2
    qtbot.waitUntil(lambda: _stats(window).get("restored", 0) >= 1, timeout=TIMEOUT)
