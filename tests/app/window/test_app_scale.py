"""The whole window on a conversation of 1,000 messages (1,100 nodes): every user action costs
work in proportion to what is on screen or what changed, never to the conversation's size.

Counted, not timed (the machines are shared and noisy): delegate paints and layouts, model
resets, tree-panel items rebuilt. The timings are logged for the record only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QModelIndex, QPoint
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from app.chat import message_delegate
from app.chat.message_delegate import MessageDelegate
from app.window.main_window import MainWindow
from engine.core.tree import Role, Tree
from engine.storage.store import Store
from tests.fake_engine import Script, in_process_client

log = logging.getLogger(__name__)

PAIRS = 500  # 1,000 messages on the active path
VARIANT_EVERY = 10  # every tenth user message has a second version (with its own reply)


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    seen = {"paint": 0, "size": 0, "layout": 0}
    paint, size = MessageDelegate.paint, MessageDelegate.sizeHint
    shade = message_delegate._shade_code

    def counted_layout(doc: Any) -> None:  # runs once per Markdown document built
        seen["layout"] += 1
        shade(doc)

    def counted_paint(self: MessageDelegate, *args: Any) -> None:
        seen["paint"] += 1
        paint(self, *args)

    def counted_size(self: MessageDelegate, *args: Any) -> Any:
        seen["size"] += 1
        return size(self, *args)

    monkeypatch.setattr(MessageDelegate, "paint", counted_paint)
    monkeypatch.setattr(MessageDelegate, "sizeHint", counted_size)
    monkeypatch.setattr(message_delegate, "_shade_code", counted_layout)
    return seen


def _big_tree() -> tuple[Tree, list[int]]:
    tree = Tree("You are helpful.")
    parent = tree.root.id
    users: list[int] = []
    for i in range(PAIRS):
        user = tree.add_child(parent, Role.USER, f"Question {i}: how do **rivers** form?")
        users.append(user.id)
        if i % VARIANT_EVERY == 0:
            other = tree.add_sibling(user.id, f"Question {i}, asked another way")
            tree.add_child(other.id, Role.ASSISTANT, f"Another answer {i}")
            tree.switch_variant(user.id, 0)
        reply = tree.add_child(user.id, Role.ASSISTANT,
                               f"Answer {i}.\n\n```python\nprint({i})\n```\nThat is all.")
        parent = reply.id
    tree.set_active(parent)
    return tree, users


@pytest.fixture
def big(
    qtbot: QtBot, tmp_path: Path, counts: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[MainWindow, list[int]]]:
    """After `counts`: the delegate must be made with the counting methods in place."""
    store = Store(tmp_path / "c.db")
    tree, users = _big_tree()
    store.create(tree, title="Long")
    # Opens the newest conversation; no model is needed, so no engine process either.
    win = MainWindow(store=store, engine=in_process_client(Script()))
    qtbot.addWidget(win)
    win.resize(1200, 800)
    win.show()
    qtbot.waitExposed(win)
    _settle()
    yield win, users
    win.close()


def _settle() -> None:
    for _ in range(3):
        QApplication.processEvents()


def _visible_rows(win: MainWindow) -> int:
    view = win.chat
    top = view.indexAt(QPoint(5, 1))
    bottom = view.indexAt(QPoint(5, view.viewport().height() - 2))
    last = bottom.row() if bottom.isValid() else view.model().rowCount() - 1
    return last - top.row() + 1


def _paint_once(widget: QWidget) -> None:
    widget.grab()


def test_a_thousand_message_conversation_costs_what_is_on_screen(
    big: tuple[MainWindow, list[int]], counts: dict[str, int], qtbot: QtBot
) -> None:
    win, users = big
    timings: dict[str, float] = {}
    assert win.chat.model().rowCount() == 2 * PAIRS
    assert len(win.tree_panel.node_items()) == 1 + 2 * PAIRS + 2 * (PAIRS // VARIANT_EVERY)
    # No widget per message: the chat view's viewport holds no children at all.
    assert not win.chat.viewport().findChildren(QWidget)

    # A repaint paints the visible rows only.
    counts["paint"] = 0
    started = time.perf_counter()
    _paint_once(win.chat.viewport())
    timings["repaint"] = time.perf_counter() - started
    assert 0 < counts["paint"] <= _visible_rows(win) + 2

    # Typing in the composer touches no message.
    counts["paint"] = counts["size"] = counts["layout"] = 0
    resets: list[int] = []
    win.chat.model().modelReset.connect(lambda: resets.append(1))
    qtbot.keyClicks(win.composer, "a message being written, one key at a time")
    _settle()
    assert counts["size"] == counts["paint"] == counts["layout"] == 0

    # Switching the version of a message near the end: only the tail changes, in both views.
    late = users[-VARIANT_EVERY * 2]  # 20 pairs from the end; it has two versions
    assert len(win.tree.siblings(late)) == 2
    rows_before = win.chat.model().rowCount()
    inserted: list[tuple[int, int]] = []
    win.chat.model().rowsInserted.connect(
        lambda _p, first, last: inserted.append((first, last)))
    counts["size"] = counts["layout"] = 0
    started = time.perf_counter()
    win.controller.switch_variant(late, 1)
    _settle()
    timings["switch near the end"] = time.perf_counter() - started
    assert not resets
    tail = rows_before - win.chat.model().row_of(win.tree.siblings(late)[1])
    assert inserted and all(last - first + 1 <= tail for first, last in inserted)
    update = win.tree_panel.last_update
    assert update.reused == update.drawn  # nothing redrawn from scratch
    # Markdown laid out: the new tail and the screen. (QListView still asks every row for
    # its size on a relayout; those are answered from the delegate's height cache.)
    assert counts["layout"] <= tail + _visible_rows(win)
    log.info("switch: %d size hints, %d documents laid out", counts["size"], counts["layout"])

    # A click on the first node of the tree: the branch is active, the chat scrolls there,
    # and the repaint is again the screen's worth.
    first = users[0]
    counts["paint"] = 0
    started = time.perf_counter()
    win.controller.activate_node(first)
    _settle()
    timings["jump to the top"] = time.perf_counter() - started
    counts["paint"] = 0
    _paint_once(win.chat.viewport())
    assert win.chat.indexAt(QPoint(5, 5)).row() <= 2
    assert counts["paint"] <= _visible_rows(win) + 2

    # Scrolling through everything stays within the delegate's bounded caches.
    bar = win.chat.verticalScrollBar()
    started = time.perf_counter()
    for value in range(0, bar.maximum() + 1, max(1, win.chat.viewport().height())):
        bar.setValue(value)
        _paint_once(win.chat.viewport())
    timings["scroll through"] = time.perf_counter() - started
    delegate = win.chat.delegate
    assert delegate.cache_size() <= delegate.cache_limit
    assert win.chat.indexAt(QPoint(5, 5)) != QModelIndex()

    log.info("1,000-message window: %s",
             ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in timings.items()))
