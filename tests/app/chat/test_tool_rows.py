"""Tool calls and results in the chat: rows the chat view shows for them."""

from __future__ import annotations

from collections.abc import Iterator

from PySide6.QtGui import QTextBlock, QTextDocument

from app.chat.chat_model import MessageRow, rows_from_tree
from app.chat.chat_view import ChatView
from app.chat.reasoning_blocks import GAP
from engine.core.tools import TOOL_CALLS, ToolCall
from engine.core.tree import Role, Tree
from tests.app_fixtures import painted_document


def test_a_reply_that_calls_tools_shows_its_calls() -> None:
    """A reply whose only words were a tool call is not an empty bubble."""
    tree = Tree("")
    user = tree.add_child(tree.root.id, Role.USER, "Rain in Oslo?")
    call = tree.add_child(user.id, Role.ASSISTANT, "")
    call.meta[TOOL_CALLS] = [ToolCall("call_1", "get_weather", '{"city": "Oslo"}').to_meta()]
    tool = tree.add_child(call.id, Role.TOOL, '{"rain": true}')
    rows = rows_from_tree(tree)
    assert [r.role for r in rows] == ["user", "assistant", "tool"]
    assert rows[1].text == '`get_weather({"city": "Oslo"})`' and rows[2].text == tool.text


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
            bottom += GAP + round(fold.document.size().height())
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
