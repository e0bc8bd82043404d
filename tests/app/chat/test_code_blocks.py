"""Code blocks in the chat: their exact code, Pygments colours once a message is finished, a
copy button per block (painted, hit-tested, lit on hover) and Ctrl+Alt+C."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pygments.styles import get_style_by_name  # type: ignore[import-untyped, unused-ignore]
from pygments.token import Comment, Keyword, Name, String  # type: ignore[import-untyped, unused-ignore]
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtGui import QColor, QGuiApplication, QImage, QPalette, QTextCursor
from pytestqt.qtbot import QtBot

from app.chat import code_blocks, message_delegate
from app.chat.chat_model import MessageRow
from app.chat.chat_view import ChatView
from app.chat.code_blocks import Fence, code_rect, fences, find_code_blocks, strip_rect
from app.chat.message_documents import MessageDocument, code_background, markdown_document, mix
from app.look.theme import (
    DARK_CODE_STYLE,
    LIGHT_CODE_STYLE,
    MIN_TEXT_CONTRAST,
    contrast_ratio,
    dark_palette,
)
from app.window.main_window import MainWindow
from engine.core.tree import Role, Tree
from tests.app_fixtures import painted_document

PYTHON = (
    "def rows(path):\n"
    "    # every row\n"
    "    return open(path).read().split('\\n')"
)
REPLY = f"Here:\n\n```python\n{PYTHON}\n```\n\nThen run it."
TWO_BLOCKS = (
    "First:\n\n```python\n\n\tx = 1  \nprint(x)\n```\n```bash\nls -l | head\n```\n\nDone."
)


def row(node_id: int, text: str, status: str = "complete", role: str = "assistant",
        variant: int = 0, variants: int = 1) -> MessageRow:
    return MessageRow(node_id, role, text, status, variant, variants)


@pytest.fixture
def view(chat_view: ChatView) -> ChatView:
    return chat_view


def format_of(doc: MessageDocument, needle: str) -> Any:
    """The character format of the first character of `needle` in `doc`."""
    found = doc.find(needle)
    assert not found.isNull(), needle
    cursor = QTextCursor(doc)
    cursor.setPosition(found.selectionStart() + 1)
    return cursor.charFormat()


def style_colour(style: str, token: Any) -> QColor:
    return QColor(f"#{get_style_by_name(style).style_for_token(token)['color']}")


def code_fill(palette: QPalette) -> QColor:
    """The background of a code block in an assistant bubble, as the delegate paints it."""
    base = palette.color(QPalette.ColorRole.Base)
    text = palette.color(QPalette.ColorRole.Text)
    return code_background(mix(base, text, 0.06))


def button_rect(view: ChatView, node_id: int, block: int) -> QRect:
    number = view.model().row_of(node_id)
    assert number is not None
    index = view.model().index(number, 0)
    rects = view.delegate.code_button_rects(view.visualRect(index), view.model().row_at(number))
    return rects[block]


# --- the code as written -------------------------------------------------------------


def test_fences_keep_the_code_exactly_as_written() -> None:
    assert fences(TWO_BLOCKS) == [Fence("python", "\n\tx = 1  \nprint(x)"),
                                  Fence("bash", "ls -l | head")]
    assert fences("```py\r\nx=1\r\ny=2\r\n```\r\n") == [Fence("py", "x=1\ny=2")]
    assert fences("```python\nunfinished(\n") == [Fence("python", "unfinished(")]
    assert fences("````md\n```\ninner\n```\n````") == [Fence("md", "```\ninner\n```")]
    assert fences("1. step\n   ```sh\n   ls\n     -la\n   ```") == [Fence("sh", "ls\n  -la")]
    assert fences("> ```\n> quoted\n> ```") == [Fence("", "quoted")]
    assert fences("no ``` fence ``` here, `inline` only") == []


def test_the_document_splits_adjacent_blocks_and_keeps_the_exact_code(qtbot: QtBot) -> None:
    doc = markdown_document(TWO_BLOCKS, QGuiApplication.font())
    blocks = find_code_blocks(doc, TWO_BLOCKS)
    # Qt shows the two blocks as one run of code lines and expands the tab: the source says
    # where each block ends and what it holds.
    assert [(b.language, b.code) for b in blocks] == [
        ("python", "\n\tx = 1  \nprint(x)"), ("bash", "ls -l | head")]
    assert blocks[0].last + 1 == blocks[1].first
    assert doc.findBlockByNumber(blocks[0].first + 1).text() == "    x = 1  "
    # Without the source: one block per run of code lines, with the shown text.
    assert [b.code for b in find_code_blocks(doc, None)] == [
        "\n    x = 1  \nprint(x)\nls -l | head"]
    # At the very start of a document Qt also drops the leading empty lines.
    source = "```python\n\n\n\tx = 1\n```"
    start = markdown_document(source, QGuiApplication.font())
    assert [b.code for b in find_code_blocks(start, source)] == ["\n\n\tx = 1"]


# --- colours ---------------------------------------------------------------------------


def test_a_finished_block_carries_the_light_styles_colours(view: ChatView) -> None:
    view.set_rows([row(1, "Read it:"), row(2, REPLY)])
    doc = painted_document(view, 2)
    assert doc.highlighted
    background = code_fill(view.palette())
    keyword = format_of(doc, "def").foreground().color()
    function = format_of(doc, "rows").foreground().color()
    comment = format_of(doc, "# every").foreground().color()
    string = format_of(doc, "'\\n'").foreground().color()
    # The style's own colour where it is readable on the code background ...
    assert contrast_ratio(style_colour(LIGHT_CODE_STYLE, Name.Function), background) >= 4.5
    assert function == style_colour(LIGHT_CODE_STYLE, Name.Function)
    # ... else its hue, darkened just enough to be.
    for colour, token in ((keyword, Keyword), (comment, Comment.Single), (string, String)):
        assert colour.hslHue() == pytest.approx(style_colour(LIGHT_CODE_STYLE, token).hslHue(),
                                                abs=2)
        assert contrast_ratio(colour, background) >= MIN_TEXT_CONTRAST - 0.01
    assert len({c.name() for c in (keyword, function, comment, string)}) == 4
    assert format_of(doc, "# every").fontItalic()  # the style's italics come along
    # Prose stays in the palette's text colour; the code keeps its monospace font.
    assert format_of(doc, "Then run").foreground().style() == Qt.BrushStyle.NoBrush
    code_font = format_of(doc, "def")
    assert code_font.fontFixedPitch() or "monospace" in (code_font.fontFamilies() or [])


def test_the_dark_theme_has_its_own_readable_style(view: ChatView, qtbot: QtBot) -> None:
    view.set_rows([row(2, REPLY)])
    light = format_of(painted_document(view, 2), "def").foreground().color()
    view.setPalette(dark_palette())  # a theme switch: documents are made again
    doc = painted_document(view, 2)
    background = code_fill(view.palette())
    keyword = format_of(doc, "def").foreground().color()
    assert keyword != light
    assert keyword.hslHue() == pytest.approx(
        style_colour(DARK_CODE_STYLE, Keyword).hslHue(), abs=2)
    assert format_of(doc, "rows").foreground().color() == style_colour(
        DARK_CODE_STYLE, Name.Function)
    for needle in ("def", "rows", "# every", "'\\n'", "path"):
        colour = format_of(doc, needle).foreground()
        if colour.style() != Qt.BrushStyle.NoBrush:
            assert contrast_ratio(colour.color(), background) >= MIN_TEXT_CONTRAST - 0.01


def test_a_streaming_block_stays_plain_and_is_coloured_once_it_finishes(
    view: ChatView, monkeypatch: pytest.MonkeyPatch
) -> None:
    highlights: list[int] = []
    lexed: list[str] = []
    highlight, lex = message_delegate.highlight, code_blocks.lexed_spans

    def counted_highlight(doc: Any, *args: Any) -> int:
        highlights.append(1)
        return int(highlight(doc, *args))

    def counted_lex(language: str, text: str) -> Any:
        lexed.append(text)
        return lex(language, text)

    monkeypatch.setattr(message_delegate, "highlight", counted_highlight)
    monkeypatch.setattr(code_blocks, "lexed_spans", counted_lex)
    lex.cache_clear()
    view.set_rows([row(1, "Write it", role="user"), row(2, "", status="streaming")])
    for end in range(10, len(REPLY) + 1, 9):
        view.update_text(2, REPLY[:end], "streaming")
        doc = painted_document(view, 2)
        assert not doc.highlighted
    assert highlights == [] and lexed == []
    assert format_of(doc, "def").foreground().style() == Qt.BrushStyle.NoBrush
    assert view.delegate.code_button_rects(view.visualRect(view.model().index(1, 0)),
                                           view.model().row_at(1)) == []
    streaming_height = view.visualRect(view.model().index(1, 0)).height()

    view.update_text(2, REPLY, "complete")
    doc = painted_document(view, 2)
    assert doc.highlighted and highlights == [1]
    assert format_of(doc, "def").foreground().style() != Qt.BrushStyle.NoBrush
    # The strip was there while it streamed: finishing does not make the message jump.
    assert view.visualRect(view.model().index(1, 0)).height() == streaming_height
    for _ in range(3):
        painted_document(view, 2)
    assert highlights == [1]
    # Another width lays the message out again, from the lexer's cache.
    view.resize(560, 620)
    painted_document(view, 2)
    assert len(highlights) == 2
    assert lex.cache_info().misses == 1 and len(lexed) == 2


def test_an_unknown_or_missing_language_stays_plain(view: ChatView) -> None:
    view.set_rows([row(1, "```\ndef plain(): pass\n```\n\n```nosuchlanguage\ndef x(): pass\n```")])
    doc = painted_document(view, 1)
    assert len(doc.code_blocks) == 2
    for needle in ("def plain", "def x"):
        assert format_of(doc, needle).foreground().style() == Qt.BrushStyle.NoBrush


def test_a_huge_block_is_shown_plain_but_copied_whole(view: ChatView) -> None:
    code = "\n".join(f"value_{i} = {i}  # line {i}" for i in range(1500))
    assert len(code) > code_blocks.MAX_HIGHLIGHT_CHARS
    view.set_rows([row(1, f"```python\n{code}\n```")])
    doc = painted_document(view, 1)
    assert doc.highlighted  # looked at once, and left plain
    assert format_of(doc, "# line 7").foreground().style() == Qt.BrushStyle.NoBrush
    assert view.delegate.code_of(view.model().row_at(0), view.viewport().width()) == (code,)


# --- the copy buttons -------------------------------------------------------------------


def test_each_copy_button_puts_exactly_its_code_on_the_clipboard(
    view: ChatView, qtbot: QtBot
) -> None:
    view.set_rows([row(1, "Two, please", role="user"), row(2, TWO_BLOCKS), row(3, REPLY)])
    view.scroll_to_node(2)
    view.viewport().grab()
    notices: list[tuple[str, int]] = []
    view.notice.connect(lambda text, ms: notices.append((text, ms)))
    clipboard = QGuiApplication.clipboard()
    for block, code in enumerate(("\n\tx = 1  \nprint(x)", "ls -l | head")):
        clipboard.setText("something else")
        rect = button_rect(view, 2, block)
        assert view.viewport().rect().contains(rect)
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        assert clipboard.text() == code
        assert notices[-1][0] == f"Copied code block {block + 1} of 2"
    # One block: "Copied"; the button says so for a moment.
    view.scroll_to_node(3)
    rect = button_rect(view, 3, 0)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert clipboard.text() == PYTHON
    assert notices[-1][0] == "Copied"
    assert view.delegate.copied_button == (3, 0)
    qtbot.waitUntil(lambda: view.delegate.copied_button is None, timeout=5000)
    # A click beside a button copies nothing; the buttons sit inside their bubbles.
    clipboard.setText("unchanged")
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton,
                     pos=rect.center() - QPoint(rect.width(), 0))
    assert clipboard.text() == "unchanged"
    assert view.visualRect(view.model().index(2, 0)).contains(rect)


def test_a_copy_button_lights_up_under_the_pointer(view: ChatView, qtbot: QtBot) -> None:
    view.set_rows([row(1, REPLY)])
    rect = button_rect(view, 1, 0)

    def button_pixels() -> QImage:
        return view.viewport().grab(rect).toImage()

    plain = button_pixels()
    qtbot.mouseMove(view.viewport(), rect.center())
    qtbot.waitUntil(lambda: view.delegate.hovered_button == (1, 0), timeout=2000)
    assert view.viewport().cursor().shape() == Qt.CursorShape.PointingHandCursor
    assert button_pixels() != plain
    qtbot.mouseMove(view.viewport(), QPoint(rect.left() - 60, rect.bottom() + 40))
    qtbot.waitUntil(lambda: view.delegate.hovered_button is None, timeout=2000)
    assert button_pixels() == plain


def test_ctrl_alt_c_copies_the_current_messages_blocks_in_turn(
    view: ChatView, qtbot: QtBot
) -> None:
    view.set_rows([row(1, "No code here", role="user"), row(2, TWO_BLOCKS)])
    view.setFocus()
    view.select_node(1)
    assert not view.copy_code_action.isEnabled()
    view.select_node(2)
    assert view.copy_code_action.isEnabled()
    clipboard = QGuiApplication.clipboard()
    copied = []
    for _ in range(3):
        qtbot.keyClick(view, Qt.Key.Key_C,
                       Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier)
        copied.append(clipboard.text())
    assert copied == ["\n\tx = 1  \nprint(x)", "ls -l | head", "\n\tx = 1  \nprint(x)"]
    assert view.copy_code_action in view.context_menu().actions()


def test_long_code_lines_wrap_inside_the_bubble(view: ChatView) -> None:
    long_line = "x = [" + ", ".join(str(i) for i in range(400)) + "]"
    view.set_rows([row(1, f"```python\n{long_line}\n```", role="user"),
                   row(2, f"```python\n{long_line}\n```")])
    for node_id in (1, 2):
        doc = painted_document(view, node_id)
        assert doc.size().width() <= doc.textWidth() + 1
        line = doc.findBlockByNumber(doc.code_blocks[0].first)
        assert line.text() == long_line and line.layout().lineCount() > 3  # wrapped
        bubble = view.visualRect(view.model().index(node_id - 1, 0))
        assert bubble.contains(button_rect(view, node_id, 0))


# --- in the window ---------------------------------------------------------------------


def test_the_status_bar_says_copied(
    offline_window: Callable[[Tree], MainWindow], qtbot: QtBot
) -> None:
    tree = Tree("")
    question = tree.add_child(tree.root_id, Role.USER, "How do I list files?")
    tree.add_child(question.id, Role.ASSISTANT, "Like this:\n\n```bash\nls -la\n```")
    win = offline_window(tree)
    chat = win.chat
    reply = chat.model().rows()[-1]
    chat.scroll_to_node(reply.node_id)
    chat.viewport().grab()
    rect = button_rect(chat, reply.node_id, 0)
    qtbot.mouseClick(chat.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert QGuiApplication.clipboard().text() == "ls -la"
    assert win.statusBar().currentMessage() == "Copied"


def test_a_message_that_opens_with_code_has_its_strip_inside_the_message(
    view: ChatView
) -> None:
    """Qt drops a document's first block's top margin: the strip must not rise above it."""
    view.model().set_rows([row(1, "```python\nprint(1)\n```\n\nThat prints one.")])
    doc = painted_document(view, 1)
    (code,) = doc.code_blocks
    height = view.delegate._strip_height(view.font())
    strip = strip_rect(doc, code, height, 300.0)
    assert strip.top() >= 0 and strip.bottom() <= code_rect(doc, code, 300.0).top() + 0.5
