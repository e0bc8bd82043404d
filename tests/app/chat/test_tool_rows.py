"""Tool calls and results in the chat: rows the chat view shows for them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontInfo, QGuiApplication, QTextBlock, QTextCharFormat, QTextDocument
from pytestqt.qtbot import QtBot

from app.chat.chat_model import MessageRow, accessible_description, accessible_text, rows_from_tree
from app.chat.chat_view import ChatView
from app.chat.reasoning_blocks import GAP
from engine.core.tools import TOOL_CALL_ID, TOOL_CALLS, ToolCall
from engine.core.tree import Role, Tree
from tests.app_fixtures import painted_document


def test_a_reply_keeps_its_words_and_its_calls_apart() -> None:
    """A reply's row holds what it said; its calls come beside it, not in its text."""
    tree = Tree("")
    user = tree.add_child(tree.root.id, Role.USER, "Rain in Oslo?")
    call = tree.add_child(user.id, Role.ASSISTANT, "")
    made = ToolCall("call_1", "get_weather", '{"city": "Oslo"}')
    call.meta[TOOL_CALLS] = [made.to_meta()]
    tool = tree.add_child(call.id, Role.TOOL, '{"rain": true}')
    tool.meta[TOOL_CALL_ID] = made.id
    rows = rows_from_tree(tree)
    assert [r.role for r in rows] == ["user", "assistant", "tool"]
    assert rows[1].text == "" and rows[1].calls == (made,)
    assert rows[2].text == tool.text and rows[2].calls == ()
    assert rows[2].call == 'get_weather({"city": "Oslo"})'


def test_an_unfolded_result_ends_with_its_last_line(chat_view: ChatView) -> None:
    """A result is all fold: below it, no empty line of an answer it does not have; a
    reasoning reply's answer keeps its place below its fold."""
    result = MessageRow(3, "tool", '{"sky": "rain", "temp_c": 9}', "complete", 0, 1,
                        call='get_weather({"city": "Oslo"})')
    reply = MessageRow(4, "assistant", "<think>\nRain, then.\n</think>\n\nTake the tram.",
                       "complete", 0, 1, reasoning_shown=True)
    chat_view.set_rows([result, reply])
    for shown in (False, True):
        if shown:
            chat_view.toggle_reasoning(3)
        doc = painted_document(chat_view, 3)
        fold = doc.reasoning
        assert fold is not None and fold.shown is shown and doc.toPlainText() == ""
        bottom = fold.header_height
        if fold.document is not None:
            assert fold.document.toPlainText() == '{"sky": "rain", "temp_c": 9}'
            assert fold.document.blockCount() == 1
            bottom += GAP + fold.body_height  # the result's box, its padding included
        assert not any(_visible_blocks(doc))  # no empty line below the fold
        assert doc.size().height() == bottom
    answered = painted_document(chat_view, 4)
    assert answered.reasoning is not None and answered.reasoning.document is not None
    assert [b.text() for b in _visible_blocks(answered)] == ["Take the tram."]
    assert answered.size().height() > answered.reasoning.height  # the answer, below it


def _visible_blocks(doc: QTextDocument) -> Iterator[QTextBlock]:
    block = doc.begin()
    while block.isValid():
        if block.isVisible():
            yield block
        block = block.next()


# --- a tool's result: data, shown as it came --------------------------------------------------

HOURLY = ('{"07:00": {"sky": "cloudy", "temp_c": 7}, "08:00": {"sky": "rain", "temp_c": 8},\n'
          ' "17:00": {"sky": "clear", "temp_c": 11}}')
MARKUP = "# not a heading\n*stars* _under_ `tick` <b>bold</b> &amp; [a](b)\n    - indented"


def result_row(node_id: int, text: str, shown: bool | None = True) -> MessageRow:
    return MessageRow(node_id, "tool", text, "complete", 0, 1, call="search()",
                      reasoning_shown=shown)


def unfolded(view: ChatView, node_id: int) -> QTextDocument:
    fold = painted_document(view, node_id).reasoning
    assert fold is not None and fold.verbatim and fold.document is not None
    return fold.document


def test_a_results_lines_and_indentation_are_kept(chat_view: ChatView) -> None:
    text = "first line\n  indented second\n\n\tfourth, after an empty one"
    chat_view.set_rows([result_row(1, text)])
    doc = unfolded(chat_view, 1)
    assert doc.toPlainText() == text
    assert [b.text() for b in _blocks(doc)] == text.split("\n")
    fold = painted_document(chat_view, 1).reasoning
    assert fold is not None and fold.label == "search() · 4 lines"


def test_a_multi_line_json_result_is_laid_out_and_kept_as_stored(chat_view: ChatView) -> None:
    """JSON is shown a member a line (short ones stay whole); the row keeps the text."""
    chat_view.set_rows([result_row(1, HOURLY)])
    lines = unfolded(chat_view, 1).toPlainText().split("\n")
    assert lines == ["{",
                     '  "07:00": {"sky": "cloudy", "temp_c": 7},',
                     '  "08:00": {"sky": "rain", "temp_c": 8},',
                     '  "17:00": {"sky": "clear", "temp_c": 11}',
                     "}"]
    assert chat_view.model().row_at(0).text == HOURLY
    label = painted_document(chat_view, 1).reasoning
    assert label is not None and label.label.endswith("· 5 lines")  # the lines it shows


def test_markdown_and_html_in_a_result_are_shown_literally(chat_view: ChatView) -> None:
    chat_view.set_rows([result_row(1, MARKUP)])
    doc = unfolded(chat_view, 1)
    assert doc.toPlainText() == MARKUP
    for block in _blocks(doc):
        assert block.blockFormat().headingLevel() == 0
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            assert not fmt.isAnchor() and not fmt.fontItalic()
            assert not fmt.font().bold()
            it += 1
    assert QFontInfo(doc.defaultFont()).fixedPitch()


def test_a_long_result_line_wraps_inside_the_bubble(chat_view: ChatView) -> None:
    line = "word " * 200
    chat_view.set_rows([result_row(1, line)])
    doc = unfolded(chat_view, 1)
    layout = doc.begin().layout()
    assert layout is not None and layout.lineCount() > 3
    assert doc.size().width() <= chat_view.viewport().width()


def test_a_result_folds_with_ctrl_shift_k_and_says_so(
    chat_view: ChatView, qtbot: QtBot, monkeypatch: pytest.MonkeyPatch,
) -> None:
    said: list[str] = []
    monkeypatch.setattr("app.chat.chat_view.announce", lambda _widget, text: said.append(text))
    thinking = MessageRow(2, "assistant", "<think>\nHm.\n</think>\n\nYes.", "complete", 0, 1)
    chat_view.set_rows([result_row(1, HOURLY, shown=None), thinking])
    row = chat_view.model().row_at(0)
    assert accessible_text(row) == "Tool result, result of search() collapsed, 5 lines"
    assert "Result collapsed: Ctrl+Shift+K shows it" in accessible_description(row)
    chat_view.setFocus()
    chat_view.select_node(1)
    action = chat_view.action("toggle_reasoning")
    assert action.isEnabled() and action.text() == "Show/hide res&ult"
    assert action.toolTip() == "Fold or unfold this tool's result (Ctrl+Shift+K)"
    qtbot.keyClick(chat_view, Qt.Key.Key_K,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: chat_view.model().row_at(0).reasoning_shown is True, timeout=3000)
    assert said == ["Result shown, 5 lines"]
    row = chat_view.model().row_at(0)
    assert accessible_text(row) == f"Tool result, result of search(), 5 lines: {HOURLY}"
    chat_view.select_node(2)  # a reply's reasoning: the action has its own words again
    assert action.text() == "Show/hide re&asoning"


def test_a_result_with_a_fence_has_no_code_block(chat_view: ChatView) -> None:
    text = "```python\nprint('hi')\n```"
    chat_view.set_rows([result_row(1, text)])
    assert unfolded(chat_view, 1).toPlainText() == text
    assert "code block" not in accessible_description(chat_view.model().row_at(0))
    chat_view.select_node(1)
    assert not chat_view.copy_code_action.isEnabled()


# --- a reply's calls: blocks of their own -----------------------------------------------------

WEATHER = ToolCall("call_1", "get_weather", '{"city": "Oslo", "day": "tomorrow"}')
SEARCH = ToolCall("call_2", "search", '{"query": "bike lanes in Oslo", "filters": '
                  '{"year": 2024, "kinds": ["news", "maps"]}, "limit": 10}')


def reply_row(node_id: int, text: str, *calls: ToolCall) -> MessageRow:
    return MessageRow(node_id, "assistant", text, "complete", 0, 1, calls=calls)


def test_a_calls_block_shows_its_name_and_arguments(chat_view: ChatView) -> None:
    chat_view.set_rows([reply_row(1, "Let me look *that* up.", SEARCH)])
    doc = painted_document(chat_view, 1)
    lines = [b.text() for b in _visible_blocks(doc)]
    assert lines == ["Let me look that up.",
                     "Tool call search",
                     "{",
                     '  "query": "bike lanes in Oslo",',
                     '  "filters": {"year": 2024, "kinds": ["news", "maps"]},',
                     '  "limit": 10',
                     "}"]
    prose = doc.begin()
    assert any(_formats(prose, lambda f: f.fontItalic()))  # the prose is Markdown
    name = doc.find("search").block()
    assert _formats(name, lambda f: f.font().bold()) == ["search"]
    box = doc.find("search").currentFrame()
    assert box is not doc.rootFrame()  # a block of its own, framed
    for block in _visible_blocks(doc):
        if block.text().startswith(("{", " ", "}")):
            assert all(QFontInfo(f.font()).fixedPitch() for f in _all_formats(block))


def test_a_reply_that_only_calls_tools_has_no_empty_prose(chat_view: ChatView) -> None:
    chat_view.set_rows([reply_row(1, "", WEATHER), reply_row(2, "Checking.", WEATHER),
                        reply_row(3, "", WEATHER, SEARCH)])
    only = painted_document(chat_view, 1)
    assert [b.text() for b in _visible_blocks(only)] == [
        "Tool call get_weather", '{"city": "Oslo", "day": "tomorrow"}']
    said = painted_document(chat_view, 2)
    line = said.documentLayout().blockBoundingRect(said.begin()).height()
    # Without its line of prose (and the gap below it) the call is all the bubble holds.
    assert only.size().height() < said.size().height() - line
    both = painted_document(chat_view, 3)
    assert [b.text() for b in _visible_blocks(both)][:3] == [
        "Tool call get_weather", '{"city": "Oslo", "day": "tomorrow"}', "Tool call search"]
    assert accessible_text(chat_view.model().row_at(0)) == (
        "Assistant: Calls get_weather with city: Oslo, day: tomorrow.")
    assert accessible_text(chat_view.model().row_at(1)) == (
        "Assistant: Checking. Calls get_weather with city: Oslo, day: tomorrow.")


def test_copying_a_reply_takes_its_calls_and_a_result_as_stored(
    chat_view: ChatView, qtbot: QtBot,
) -> None:
    chat_view.set_rows([reply_row(1, "Checking.", WEATHER), result_row(2, HOURLY)])
    clipboard = QGuiApplication.clipboard()
    chat_view.setFocus()
    chat_view.select_node(1)
    chat_view.action("copy").trigger()
    assert clipboard.text() == 'Checking.\n\n`get_weather({"city": "Oslo", "day": "tomorrow"})`'
    chat_view.select_node(2)
    chat_view.action("copy").trigger()
    assert clipboard.text() == HOURLY


def test_a_reply_with_reasoning_and_only_calls(chat_view: ChatView) -> None:
    """The reasoning's fold above, the call below it, no empty answer between."""
    chat_view.set_rows([reply_row(1, "<think>\nRain?\n</think>\n\n", WEATHER)])
    doc = painted_document(chat_view, 1)
    assert doc.reasoning is not None and not doc.reasoning.shown
    assert next(b.text() for b in _visible_blocks(doc)) == "Tool call get_weather"
    first = doc.documentLayout().frameBoundingRect(doc.find("get_weather").currentFrame())
    assert first.top() == doc.reasoning.height  # right below the fold


def _blocks(doc: QTextDocument) -> Iterator[QTextBlock]:
    block = doc.begin()
    while block.isValid():
        yield block
        block = block.next()


def _all_formats(block: QTextBlock) -> list[QTextCharFormat]:
    found = []
    it = block.begin()
    while not it.atEnd():
        found.append(it.fragment().charFormat())
        it += 1
    return found


def _formats(block: QTextBlock, wanted: Callable[[QTextCharFormat], bool]) -> list[str]:
    """The texts of `block`'s fragments whose format `wanted` accepts."""
    found = []
    it = block.begin()
    while not it.atEnd():
        fragment = it.fragment()
        if wanted(fragment.charFormat()):
            found.append(fragment.text())
        it += 1
    return found


def test_a_streamed_reply_shows_its_calls_once_they_come(chat_view: ChatView,
                                                         qtbot: QtBot) -> None:
    """A reply streams its words; its calls come with the rows made when it ends."""
    chat_view.set_rows([MessageRow(1, "assistant", "", "streaming", 0, 1)])
    chat_view.update_text(1, "Checking.")
    rect = chat_view.visualRect(chat_view.model().index(0, 0))
    streamed = rect.height()
    chat_view.set_rows([reply_row(1, "Checking.", WEATHER)])
    qtbot.waitUntil(lambda: chat_view.visualRect(chat_view.model().index(0, 0)).height()
                    > streamed + 20, timeout=3000)
    assert "Tool call get_weather" in painted_document(chat_view, 1).toPlainText()
