"""Tool calls and results in the chat: rows the chat view shows for them."""

from __future__ import annotations

from app.chat.chat_model import rows_from_tree
from engine.core.tools import TOOL_CALLS, ToolCall
from engine.core.tree import Role, Tree


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
