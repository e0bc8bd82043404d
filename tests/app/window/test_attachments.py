"""Documents in the window: attached by a drop, a paste or the dialog, read off the GUI thread,
sent with the next message, shown folded above it; a bad file is refused with one line and
changes nothing. On the fake engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.chat.chat_model import documents_label, reasoning_label, reasoning_of, rows_from_tree
from app.window.main_window import MainWindow
from engine.core.attachments import DOCUMENTS, documents_of
from engine.core.tree import Role
from tests.app_fixtures import TIMEOUT, painted_document, warnings_shown

# HTML, PDF and DOCX are read in a process of their own.
pytestmark = pytest.mark.engine_process


def _files(*paths: Path) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    return mime


def _attached(qtbot: QtBot, win: MainWindow, count: int) -> None:
    qtbot.waitUntil(lambda: len(win.attachments.documents) == count
                    and not win.attachments.reading, timeout=TIMEOUT)


def test_a_dropped_document_goes_with_the_next_message_and_shows_folded_above_it(
    qtbot: QtBot, fake_window: MainWindow, tmp_path: Path
) -> None:
    win = fake_window
    notes = tmp_path / "notes.md"
    notes.write_text("# Plan\n\nShip the release on Friday.\n", encoding="utf-8")
    page = tmp_path / "page.html"
    page.write_text("<html><body><p>Hello <b>page</b></p><script>x()</script></body></html>",
                    encoding="utf-8")
    dropped, pasted = _files(notes), _files(page)  # kept: the event does not own its data
    drop = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, dropped,
                      Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier)
    win.composer.dropEvent(drop)
    win.composer.insertFromMimeData(pasted)  # a paste of a copied file
    _attached(qtbot, win, 2)
    assert win.composer.toPlainText() == ""  # a file is not its path as text
    assert win.attachment_strip.isVisible() and len(win.attachment_strip.buttons) == 2
    win.composer.setPlainText("When do we ship?")
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        qtbot.keyClick(win.composer, Qt.Key.Key_Return)
    assert win.attachments.documents == () and not win.attachment_strip.isVisible()
    user = next(n for n in win.tree.messages() if n.role is Role.USER)
    assert user.text == "When do we ship?"
    docs = documents_of(user.meta)
    assert [d.name for d in docs] == ["notes.md", "page.html"]
    assert docs[1].text == "Hello page"
    # Kept in the store with the message.
    stored = win.store.load(win.current or -1)
    assert documents_of(stored.node(user.id).meta) == docs
    # The bubble: the question, and a fold naming the documents above it.
    row = next(r for r in rows_from_tree(win.tree) if r.node_id == user.id)
    split = reasoning_of(row)
    assert split is not None and split.answer == "When do we ship?"
    assert reasoning_label(row, split) == documents_label(docs) == \
        "2 documents: notes.md, page.html"
    win.chat.toggle_reasoning(user.id)
    doc = painted_document(win.chat, user.id)
    assert doc.reasoning is not None and doc.reasoning.document is not None
    assert "Ship the release on Friday." in doc.reasoning.document.toPlainText()
    assert doc.toPlainText() == "When do we ship?"


def test_documents_alone_can_be_sent_and_an_edit_keeps_them(
    qtbot: QtBot, fake_window: MainWindow, tmp_path: Path
) -> None:
    win = fake_window
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n", encoding="utf-8")
    win.attachments.add([data])
    _attached(qtbot, win, 1)
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        qtbot.keyClick(win.composer, Qt.Key.Key_Return)  # no text: the document is the message
    user = next(n for n in win.tree.messages() if n.role is Role.USER)
    assert user.text == "" and [d.name for d in documents_of(user.meta)] == ["data.csv"]
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        win.controller.edit(user.id, "Sum the columns.")
    edited = next(n for n in win.tree.messages() if n.role is Role.USER)
    assert edited.id != user.id and edited.text == "Sum the columns."
    assert edited.meta[DOCUMENTS] == user.meta[DOCUMENTS]


def test_a_bad_file_is_refused_with_one_line_and_nothing_changes(
    qtbot: QtBot, fake_window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    win = fake_window
    shown = warnings_shown(monkeypatch)
    binary = tmp_path / "tool.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(200))
    locked = tmp_path / "broken.pdf"
    locked.write_bytes(b"%PDF-1.7\nnot really")
    before = [n.id for n in win.tree.nodes()]
    win.attachments.add([binary, locked])
    qtbot.waitUntil(lambda: len(shown) == 2, timeout=TIMEOUT)
    assert not win.attachments.reading and win.attachments.documents == ()
    assert any("tool.bin is not a text file" in w for w in shown)
    assert any("broken.pdf" in w for w in shown)
    assert [n.id for n in win.tree.nodes()] == before
    assert not win.attachment_strip.isVisible()


def test_a_read_can_be_cancelled_and_closing_the_window_ends_every_read(
    qtbot: QtBot, fake_window: MainWindow, tmp_path: Path
) -> None:
    win = fake_window
    page = tmp_path / "big.html"
    page.write_text("<p>" + "words " * 200_000 + "</p>", encoding="utf-8")
    win.attachments.add([page])
    assert win.attachments.reading == ("big.html",)
    assert win.attachment_strip.cancel_button.isVisibleTo(win)
    win.attachment_strip.cancel_button.click()
    qtbot.waitUntil(lambda: not win.attachments.reading, timeout=TIMEOUT)
    assert win.attachments.documents == ()
    win.attachments.add([page])  # still reading when the window closes: the fixture checks
    QApplication.processEvents()  # that no thread is left running


@pytest.mark.parametrize("choice", ["Attach its start", "Search it", "Don't attach"])
def test_a_document_longer_than_the_context_is_never_cut_silently(
    qtbot: QtBot, fake_window: MainWindow, tmp_path: Path, choice: str
) -> None:
    from PySide6.QtWidgets import QMessageBox

    from engine.core.attachments import Reading

    win = fake_window
    win.attachments.room = lambda: 2000  # characters: far less than the book
    book = tmp_path / "book.txt"
    book.write_text("\n\n".join(f"Chapter {n}: the lighthouse keeper's log, page {n}. "
                                * 8 for n in range(60)), encoding="utf-8")
    win.attachments.add([book])
    qtbot.waitUntil(lambda: win.findChild(QMessageBox) is not None, timeout=TIMEOUT)
    box = win.findChild(QMessageBox)
    assert box is not None and "book.txt is about" in box.text()
    assert win.attachments.documents == ()  # nothing until the user has chosen
    (button,) = [b for b in box.buttons() if b.text() == choice]
    button.click()
    if choice == "Don't attach":
        assert win.attachments.documents == ()
        return
    (document,) = win.attachments.documents
    assert document.reading is (Reading.START if choice == "Attach its start"
                                else Reading.SEARCH)
    assert document.reads <= 2000
    win.composer.setPlainText("What is on page 42?")
    with qtbot.waitSignal(win.reply_finished, timeout=TIMEOUT):
        qtbot.keyClick(win.composer, Qt.Key.Key_Return)
    user = next(n for n in win.tree.messages() if n.role is Role.USER)
    (read,) = documents_of(user.meta)
    assert len(read.text) <= 2000
    if choice == "Search it":
        assert "page 42." in read.text and "[passage" in read.text
    else:
        assert read.text.endswith("characters]") and "page 42." not in read.text
