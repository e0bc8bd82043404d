"""Fixtures for driving the real main window on a real engine with a tiny model.

Loaded for every test module through `pytest_plugins` in conftest.py, so it imports Qt's core
only: the window, its engine clients and llama.cpp are imported by the fixtures that use them.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from engine.config.settings import Settings
from tests.fake_engine import Script, in_process_client

if TYPE_CHECKING:
    from PySide6.QtCore import QObject
    from pytestqt.qtbot import QtBot

    from app.chat.chat_view import ChatView
    from app.chat.message_documents import MessageDocument
    from app.state.engine_client import QtEngine
    from app.window.main_window import MainWindow
    from engine.core.tree import Tree

# A hang guard, not a speed claim: a random-weight model answers up to its token limit and a
# shared machine may be slow; every wait ends as soon as its signal comes.
TIMEOUT = 240_000
# Short replies keep the tests quick; a test that needs a long one sets its own.
TEST_SETTINGS = Settings(max_tokens=48)


@pytest.fixture
def engine_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the thread of every call into llama.cpp's decode and state functions."""
    import engine.llm.llama as llama_layer

    seen: list[int] = []
    for name in ("decode", "state_get", "state_set", "clear"):
        original = getattr(llama_layer.LlamaContext, name)

        def wrapper(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            seen.append(threading.get_ident())
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(llama_layer.LlamaContext, name, wrapper)
    return seen


def open_window(qtbot: QtBot, tmp_path: Path, model: Path,
                engine: QtEngine | None = None) -> MainWindow:
    """A shown main window on its own store, with `model` loaded."""
    from app.window.main_window import MainWindow
    from engine.storage.store import Store

    win = MainWindow(store=Store(tmp_path / "conversations.db"), settings=TEST_SETTINGS,
                     engine=engine)
    qtbot.addWidget(win)
    win.show()
    with qtbot.waitSignal(win.model_ready, timeout=TIMEOUT):
        win.models.load_model(str(model))
    return win


def warnings_shown(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts of the window's warning dialogs from now on (none of them opens)."""
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))
    return shown


def destroy(*objects: QObject) -> None:
    """Destroy them now: a window left for the garbage collector still answers app-wide
    signals (a theme change repaints its icons) in the tests that follow."""
    from PySide6.QtCore import QCoreApplication, QEvent

    for item in objects:
        item.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (closed again at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def window(
    qtbot: QtBot, tmp_path: Path, tiny_models: dict[str, Path], engine_calls: list[int]
) -> Iterator[MainWindow]:
    """The main window as the app runs it: the engine in a process of its own, the tiny
    dense model loaded. On teardown, proof that llama.cpp never ran in the window's process
    and that closing the window left no engine process behind."""
    win = open_window(qtbot, tmp_path, tiny_models["dense"])
    pid = win.replies.engine_pid
    assert pid is not None and pid != os.getpid()
    yield win
    win.close()
    assert not win.engine.running
    assert process_gone(win.replies.engine_pid or pid) and process_gone(pid)
    assert engine_calls == [], "llama.cpp decoded in the window's process"
    destroy(win)


@pytest.fixture
def fake_engine() -> Script:
    """The script of the fake engine (tests/fake_engine.py) a `fake_window` runs on: a test
    changes it to change what the engine answers."""
    return Script()


@pytest.fixture
def fake_window(
    qtbot: QtBot, tmp_path: Path, fake_engine: Script, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MainWindow]:
    """The main window on the scripted fake engine, run by the in-process client, with a
    fake model loaded: for what the window does with the engine's events (no model, no
    engine process, milliseconds a test). On teardown, proof the engine was shut down."""
    win = open_window(qtbot, tmp_path, tmp_path / "fake-model.gguf",
                      in_process_client(fake_engine))
    yield win
    win.close()
    assert not win.engine.running
    destroy(win)


@pytest.fixture
def smol_window(qtbot: QtBot, tmp_path: Path, smollm2_path: Path) -> Iterator[MainWindow]:
    """The window (engine process) on the bundled SmolLM2: real states, megabytes each."""
    win = open_window(qtbot, tmp_path, smollm2_path)
    yield win
    win.close()
    destroy(win)


@pytest.fixture
def thread_window(
    qtbot: QtBot, tmp_path: Path, tiny_models: dict[str, Path], engine_calls: list[int]
) -> Iterator[MainWindow]:
    """The main window with its engine on a thread of this process (`ThreadEngine`), for
    tests that reach into the engine; on teardown, proof that llama.cpp ran only on the
    engine thread."""
    from app.state.engine_client import ThreadEngine

    engine = ThreadEngine()
    win = open_window(qtbot, tmp_path, tiny_models["dense"], engine)
    yield win
    win.close()
    assert not win.engine.running
    main = threading.get_ident()
    assert engine_calls, "the test should have run the engine"
    assert all(ident != main for ident in engine_calls), "llama.cpp called from the GUI thread"
    assert set(engine_calls) == {engine.engine_thread_ident}
    destroy(win)


@pytest.fixture
def offline_window(
    qtbot: QtBot, tmp_path: Path, fake_engine: Script, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[Tree], MainWindow]]:
    """Opens the window on a store holding `tree` (its newest conversation), with no model:
    for what the window does without the engine (showing, switching, copying). Its engine is
    the fake one, idle: no engine process starts."""
    from app.window.main_window import MainWindow
    from engine.storage.store import Store

    opened: list[MainWindow] = []

    def open_on(tree: Tree) -> MainWindow:
        store = Store(tmp_path / f"offline-{len(opened)}.db")
        store.create(tree, title="Offline")
        win = MainWindow(store=store, settings=TEST_SETTINGS,
                         engine=in_process_client(fake_engine))
        qtbot.addWidget(win)
        win.resize(1100, 760)
        win.show()
        qtbot.waitExposed(win)
        opened.append(win)
        return win

    yield open_on
    for win in opened:
        win.close()
        assert not win.engine.running
        win.store.close()
    destroy(*opened)


def send(qtbot: QtBot, win: MainWindow, text: str) -> None:
    """Type a message and press Enter, as a user would; returns once the reply is done."""
    from PySide6.QtCore import Qt

    win.composer.setPlainText(text)
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        qtbot.keyClick(win.composer, Qt.Key.Key_Return)


@pytest.fixture
def chat_view(qtbot: QtBot) -> Iterator[ChatView]:
    """A chat view alone, light palette, 720x620, shown."""
    from app.chat.chat_view import ChatView
    from app.look.theme import fusion_light_palette

    widget = ChatView()
    qtbot.addWidget(widget)
    widget.setPalette(fusion_light_palette())
    widget.resize(720, 620)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget


def painted_document(view: ChatView, node_id: int) -> MessageDocument:
    """Paint the view, then the document its delegate painted for `node_id`."""
    view.viewport().grab()
    number = view.model().row_of(node_id)
    assert number is not None
    shown = view.model().row_at(number)
    width = view.delegate.text_width(shown.role, view.viewport().width())
    return view.delegate.document(shown, width)
