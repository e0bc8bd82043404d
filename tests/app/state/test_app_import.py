"""File > Import through the real main window: the file is read and committed off the GUI
thread (over a second connection), and a window closed mid-import commits nothing and leaves
no thread running.

No model is loaded: importing never touches the engine, so the window runs on the fake one
(tests/fake_engine.py), idle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QCoreApplication, QThread
from pytestqt.qtbot import QtBot

import app.state.importer
import app.window.main_window
from app.window.main_window import MainWindow
from engine.core.records import from_tree
from engine.core.tree import NodeStatus, Role, Tree
from engine.storage.formats.arbor_file import write_session
from engine.storage.formats.chatgpt_export import export_chatgpt
from engine.storage.store import ConversationInfo, Store
from engine.storage.transfer import ParsedImport, parse_import
from tests.fake_engine import Script, in_process_client

TIMEOUT = 30_000
KEY = b"k" * 32


def _oak_tree() -> Tree:
    tree = Tree("Be brief.")
    question = tree.add_child(tree.root_id, Role.USER, "What is an oak?")
    tree.add_child(question.id, Role.ASSISTANT, "A tree.")
    other = tree.add_sibling(question.id, "What is a river?")
    tree.add_child(other.id, Role.ASSISTANT, "Water that flows.")
    return tree


def _chatgpt_file(tmp_path: Path) -> Path:
    path = tmp_path / "conversations.json"
    path.write_bytes(export_chatgpt([from_tree(_oak_tree(), title="Oaks")]))
    return path


def _session_file(tmp_path: Path) -> Path:
    path = tmp_path / "oaks.arbor"
    write_session(path, [from_tree(_oak_tree(), title="Oaks")], key=KEY)
    return path


def _titles(infos: list[ConversationInfo]) -> list[str]:
    return [info.title for info in infos]


@pytest.fixture
def idle_window(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MainWindow]:
    win = MainWindow(store=Store(tmp_path / "conversations.db"),
                     engine=in_process_client(Script()))
    qtbot.addWidget(win)
    win.show()
    yield win
    win.close()
    assert not win.engine.running
    assert not win.files.importer.busy


@pytest.fixture
def warnings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))
    return shown


Parse = Callable[..., ParsedImport]


def _wrap_parse(monkeypatch: pytest.MonkeyPatch, wrapper: Callable[[Parse], Parse]) -> None:
    """Replace the parse step the importer's thread calls."""
    monkeypatch.setattr(app.state.importer, "parse_import", wrapper(parse_import))


@pytest.mark.parametrize("make_file", [_chatgpt_file, _session_file], ids=["chatgpt", "arbor"])
def test_an_imported_file_is_added_listed_and_opened(
    qtbot: QtBot, idle_window: MainWindow, tmp_path: Path, warnings: list[str],
    make_file: Callable[[Path], Path],
) -> None:
    path = make_file(tmp_path)
    before = idle_window.store.list()
    with qtbot.waitSignal(idle_window.files.import_finished, timeout=TIMEOUT) as finished:
        assert idle_window.files.import_path(path)
        assert idle_window.statusBar().currentMessage() == f"Reading {path.name}…"
    (ids,) = finished.args
    assert len(ids) == 1 and warnings == []
    assert sorted(_titles(idle_window.store.list())) == sorted(["Oaks", *_titles(before)])
    assert idle_window.current == ids[0]
    assert idle_window.sidebar.current_id() == ids[0]
    assert idle_window.sidebar.list.currentItem().text() == "Oaks"
    assert [n.text for n in idle_window.tree.messages()] == ["What is a river?",
                                                             "Water that flows."]
    assert idle_window.statusBar().currentMessage() == "Imported 1 conversations."


def test_a_rejected_file_leaves_the_store_unchanged(
    qtbot: QtBot, idle_window: MainWindow, tmp_path: Path, warnings: list[str]
) -> None:
    bad = tmp_path / "conversations.json"
    bad.write_bytes(b'[{"title": "Broken", "mapping": {}, "current_node": "x"}]')
    before, current = idle_window.store.list(), idle_window.current
    with qtbot.waitSignal(idle_window.files.import_finished, timeout=TIMEOUT) as finished:
        idle_window.files.import_path(bad)
    assert finished.args == [[]]
    assert idle_window.store.list() == before and idle_window.current == current
    assert len(warnings) == 1
    assert warnings[0].startswith("conversations.json was not imported.\n\n")
    assert "has no messages" in warnings[0] and "Traceback" not in warnings[0]
    assert idle_window.statusBar().currentMessage() == ""
    assert idle_window.store.integrity_ok()


def test_parsing_and_committing_run_off_the_gui_thread(
    qtbot: QtBot, idle_window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed_on: list[int] = []
    committed_on: list[int] = []

    def record_parse(real: Parse) -> Parse:
        def parse(path: Path, **kwargs: Any) -> ParsedImport:
            parsed_on.append(threading.get_ident())
            return real(path, **kwargs)
        return parse

    real_commit = app.state.importer.commit_import

    def commit(*args: Any, **kwargs: Any) -> Any:
        committed_on.append(threading.get_ident())
        return real_commit(*args, **kwargs)

    _wrap_parse(monkeypatch, record_parse)
    monkeypatch.setattr(app.state.importer, "commit_import", commit)
    with qtbot.waitSignal(idle_window.files.import_finished, timeout=TIMEOUT) as finished:
        idle_window.files.import_path(_chatgpt_file(tmp_path))
    main = threading.get_ident()
    (ids,) = finished.args
    assert len(ids) == 1
    assert len(parsed_on) == 1 and parsed_on[0] != main
    assert committed_on == parsed_on  # the same worker thread
    assert idle_window.current == ids[0] and _titles(idle_window.store.list()).count("Oaks") == 1


def test_a_reply_streaming_in_the_window_is_not_marked_interrupted_by_an_import(
    qtbot: QtBot, idle_window: MainWindow, tmp_path: Path
) -> None:
    """The import's own connection must not run the crash recovery of the program's."""
    tree, cid = idle_window.tree, idle_window.current or 0
    user = tree.add_child(tree.active_leaf, Role.USER, "Hi")
    reply = tree.add_child(user.id, Role.ASSISTANT, "Hel", status=NodeStatus.STREAMING)
    idle_window.store.save(cid, tree, [user, reply])
    with qtbot.waitSignal(idle_window.files.import_finished, timeout=TIMEOUT):
        idle_window.files.import_path(_chatgpt_file(tmp_path))
    with Store(idle_window.store.path, recover=False) as other:
        saved = other.load(cid)
    assert saved.node(reply.id).status is NodeStatus.STREAMING


class _Blocked:
    """A parse that holds on until the test releases it or, with `until_cancelled`, until the
    importer cancels it. The waits are bounded only so that a bug fails instead of hanging."""

    def __init__(self, *, until_cancelled: bool = False) -> None:
        self.until_cancelled = until_cancelled
        self.entered = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()
        self.saw_cancel: list[bool] = []

    def wrap(self, real: Parse) -> Parse:
        def parse(path: Path, *, cancel: threading.Event, **kwargs: Any) -> ParsedImport:
            self.entered.set()
            (cancel if self.until_cancelled else self.release).wait(TIMEOUT / 1000)
            self.saw_cancel.append(cancel.is_set())
            try:
                return real(path, cancel=cancel, **kwargs)
            finally:
                self.returned.set()
        return parse


def _close_mid_import(
    qtbot: QtBot, tmp_path: Path, entered: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> tuple[MainWindow, list[ConversationInfo], list[object]]:
    """Start an import, wait until it is inside the step the test holds, close the window,
    and run whatever the close left queued. Returns the idle_window, the conversations before,
    and every `import_finished` seen."""
    win = MainWindow(store=Store(tmp_path / "c.db"),
                     engine=in_process_client(Script()))
    qtbot.addWidget(win)
    before = win.store.list()
    finished: list[object] = []
    win.files.import_finished.connect(finished.append)
    assert win.files.import_path(_chatgpt_file(tmp_path))
    assert entered.wait(TIMEOUT / 1000)
    win.close()
    QCoreApplication.processEvents()  # anything still queued must find nothing to do
    return win, before, finished


def test_closing_while_a_file_is_read_commits_nothing_and_ends_the_thread(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings: list[str]
) -> None:
    blocked = _Blocked(until_cancelled=True)
    _wrap_parse(monkeypatch, blocked.wrap)
    # The parse is still blocked at the close: only the importer's cancel can free it.
    win, before, finished = _close_mid_import(qtbot, tmp_path, blocked.entered,
                                             monkeypatch)
    assert blocked.saw_cancel == [True]
    assert not win.files.importer.busy and not win.engine.running
    assert finished == [] and warnings == []
    with Store(tmp_path / "c.db") as store:
        assert store.list() == before


def test_closing_during_the_commit_commits_nothing(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings: list[str]
) -> None:
    entered = threading.Event()
    real_commit = app.state.importer.commit_import

    def commit(parsed: Any, store: Store, **kwargs: Any) -> Any:
        entered.set()
        # Hold until the window's shutdown cancels (bounded only so a bug fails, not hangs),
        # then commit for real: the transaction must roll back.
        thread = QThread.currentThread()
        assert isinstance(thread, app.state.importer._ImportThread)
        assert thread.cancel.wait(TIMEOUT / 1000)
        return real_commit(parsed, store, **kwargs)

    monkeypatch.setattr(app.state.importer, "commit_import", commit)
    win, before, finished = _close_mid_import(qtbot, tmp_path, entered, monkeypatch)
    assert not win.files.importer.busy
    assert finished == [] and warnings == []
    with Store(tmp_path / "c.db") as store:
        assert store.list() == before
        assert store.integrity_ok()


def test_a_second_import_while_one_is_read_is_refused(
    qtbot: QtBot, idle_window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = _Blocked()
    _wrap_parse(monkeypatch, blocked.wrap)
    first = _chatgpt_file(tmp_path)
    second = _session_file(tmp_path)
    with qtbot.waitSignal(idle_window.files.import_finished, timeout=TIMEOUT) as finished:
        assert idle_window.files.import_path(first)
        assert blocked.entered.wait(TIMEOUT / 1000)
        assert not idle_window.files.import_path(second)
        assert idle_window.statusBar().currentMessage().startswith(
            "Still reading conversations.json")
        blocked.release.set()
    assert len(finished.args[0]) == 1
    assert _titles(idle_window.store.list()).count("Oaks") == 1  # the second file was not read
    with qtbot.waitSignal(idle_window.files.import_finished, timeout=TIMEOUT) as again:
        assert idle_window.files.import_path(second)  # free again once the first is done
    assert len(again.args[0]) == 1
