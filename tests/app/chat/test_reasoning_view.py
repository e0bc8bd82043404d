"""A reply's reasoning in the chat: a disclosure above the answer, folded once the answer has
started, open while only reasoning has come; a click on its header or Ctrl+Shift+K toggles it,
and screen readers hear which it is."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.chat.chat_model import ChatModel, MessageRow, accessible_description, accessible_text
from app.chat.chat_view import ChatView
from app.window.main_window import MainWindow
from engine.core.reasoning import OPENED
from engine.core.tree import NodeStatus, Role, Tree
from tests.app_fixtures import painted_document

THOUGHTS = "The user wants a greeting. " * 12  # 60 words
REPLY = f"<think>\n{THOUGHTS}\n</think>\n\nHello! How can I help?"
CODE_REPLY = f"<think>\n{THOUGHTS}\n</think>\n\n```python\nprint('hi')\n```"


SAYS_CLOSE = "The tag </think> closes reasoning."


def row(node_id: int, text: str, status: str = "complete", role: str = "assistant",
        shown: bool | None = None, opened: bool = False) -> MessageRow:
    return MessageRow(node_id, role, text, status, 0, 1, reasoning_shown=shown,
                      reasoning_opened=opened)


@pytest.fixture
def view(chat_view: ChatView) -> ChatView:
    return chat_view


def header(view: ChatView, node_id: int) -> QRect:
    number = view.model().row_of(node_id)
    assert number is not None
    rect = view.visualRect(view.model().index(number, 0))
    return view.delegate.reasoning_header_rect(rect, view.model().row_at(number))


def height(view: ChatView, node_id: int) -> int:
    number = view.model().row_of(node_id)
    assert number is not None
    return view.visualRect(view.model().index(number, 0)).height()


def test_a_finished_reply_shows_its_answer_below_a_folded_header(view: ChatView) -> None:
    view.set_rows([row(1, "Hi", role="user"), row(2, REPLY)])
    doc = painted_document(view, 2)
    assert doc.toPlainText() == "Hello! How can I help?"  # the markers and thoughts are not text
    assert doc.reasoning is not None
    assert doc.reasoning.label == "Reasoning · 60 words"
    assert not doc.reasoning.shown and doc.reasoning.document is None
    assert not header(view, 2).isEmpty()
    assert header(view, 1).isEmpty()  # a user message has no reasoning header
    assert view.visualRect(view.model().index(1, 0)).contains(header(view, 2))


def test_while_only_reasoning_streams_it_is_open_and_folds_once_the_answer_starts(
    view: ChatView,
) -> None:
    view.set_rows([row(1, "Hi", role="user"), row(2, "", status="streaming")])
    view.update_text(2, "<think>\nThe user wants")
    doc = painted_document(view, 2)
    assert doc.reasoning is not None and doc.reasoning.shown
    assert doc.reasoning.label == "Reasoning… · 3 words"
    assert doc.reasoning.document is not None
    assert doc.reasoning.document.toPlainText() == "The user wants"
    open_height = height(view, 2)
    view.update_text(2, f"<think>\n{THOUGHTS}\n</think>\n\nHello")
    doc = painted_document(view, 2)
    assert doc.reasoning is not None and not doc.reasoning.shown
    assert doc.toPlainText() == "Hello"
    assert height(view, 2) < open_height + 40  # folded: the thoughts take no room


def test_an_interrupted_reply_with_unended_reasoning_says_so(view: ChatView) -> None:
    view.set_rows([row(1, "<think>Let me think about th", status="interrupted")])
    doc = painted_document(view, 1)
    assert doc.reasoning is not None and doc.reasoning.shown
    assert doc.reasoning.label == "Reasoning, unfinished · 5 words"
    said = accessible_text(view.model().row_at(0))
    assert said.startswith("Assistant, interrupted, unfinished reasoning, 5 words:")


def test_a_click_on_the_header_unfolds_and_folds_it(view: ChatView, qtbot: QtBot) -> None:
    view.set_rows([row(1, "Hi", role="user"), row(2, REPLY)])
    folded = height(view, 2)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=header(view, 2).center())
    qtbot.waitUntil(lambda: height(view, 2) > folded + 40, timeout=3000)
    doc = painted_document(view, 2)
    assert doc.reasoning is not None and doc.reasoning.shown
    assert doc.reasoning.document is not None
    assert doc.reasoning.document.toPlainText().startswith("The user wants a greeting.")
    assert doc.toPlainText() == "Hello! How can I help?"
    assert view.model().row_at(1).reasoning_shown is True
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=header(view, 2).center())
    qtbot.waitUntil(lambda: height(view, 2) == folded, timeout=3000)
    # A click on the answer toggles nothing.
    answer = view.visualRect(view.model().index(1, 0)).bottomLeft() + QPoint(40, -20)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=answer)
    assert view.model().row_at(1).reasoning_shown is False


def test_ctrl_shift_k_toggles_the_current_replys_reasoning(view: ChatView, qtbot: QtBot) -> None:
    view.set_rows([row(1, "Hi", role="user"), row(2, REPLY)])
    action = view.action("toggle_reasoning")
    view.setFocus()
    view.select_node(1)
    assert not action.isEnabled()
    view.select_node(2)
    assert action.isEnabled()
    folded = height(view, 2)
    qtbot.keyClick(view, Qt.Key.Key_K,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: height(view, 2) > folded + 40, timeout=3000)
    assert view.model().row_at(1).reasoning_shown is True
    assert action in view.context_menu().actions()
    view.select_node(1)
    assert action not in view.context_menu().actions()


def test_the_choice_survives_new_rows_and_streaming(view: ChatView) -> None:
    """The controller feeds fresh rows (no choice in them); the model keeps the user's."""
    view.set_rows([row(1, "Hi", role="user"), row(2, REPLY)])
    assert view.toggle_reasoning(2) is True
    view.set_rows([row(1, "Hi", role="user"), row(2, REPLY), row(3, "More?", role="user")])
    assert view.model().row_at(1).reasoning_shown is True
    view.update_text(2, REPLY + " Anything else?", "complete")
    assert view.model().row_at(1).reasoning_shown is True
    assert view.toggle_reasoning(3) is None  # a user message has no reasoning
    # Another conversation whose reply has the same node id (ids are per tree): folded.
    view.model().set_rows([row(1, "Hi", role="user"), row(2, REPLY)], conversation=7)
    assert view.model().row_at(1).reasoning_shown is None
    reasoning = painted_document(view, 2).reasoning
    assert reasoning is not None and not reasoning.shown


def test_code_in_the_answer_keeps_its_copy_button_under_the_reasoning(
    view: ChatView, qtbot: QtBot
) -> None:
    from PySide6.QtGui import QGuiApplication

    view.set_rows([row(1, CODE_REPLY)])
    assert view.delegate.code_of(view.model().row_at(0), view.viewport().width()) == (
        "print('hi')",)
    for _ in range(2):  # folded, then unfolded: the button follows the answer
        number_rect = view.visualRect(view.model().index(0, 0))
        buttons = view.delegate.code_button_rects(number_rect, view.model().row_at(0))
        assert len(buttons) == 1 and not buttons[0].intersects(header(view, 1))
        QGuiApplication.clipboard().setText("")
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=buttons[0].center())
        assert QGuiApplication.clipboard().text() == "print('hi')"
        view.toggle_reasoning(1)
        view.doItemsLayout()


def test_screen_readers_hear_whether_the_reasoning_is_folded(qapp: QApplication) -> None:
    folded = row(2, REPLY)
    assert accessible_text(folded) == (
        "Assistant, reasoning collapsed, 60 words: Hello! How can I help?")
    assert "Reasoning collapsed: Ctrl+Shift+K shows it" in accessible_description(folded)
    shown = row(2, REPLY, shown=True)
    assert accessible_text(shown).startswith("Assistant, reasoning, 60 words: The user wants")
    assert accessible_text(shown).endswith("Answer: Hello! How can I help?")
    assert "Reasoning shown: Ctrl+Shift+K hides it" in accessible_description(shown)
    plain = row(3, "Just an answer.")
    assert accessible_text(plain) == "Assistant: Just an answer."
    assert "Reasoning" not in accessible_description(plain)


def test_toggling_tells_the_accessibility_roles_changed(qtbot: QtBot) -> None:
    model = ChatModel()
    model.set_rows([row(1, REPLY)])
    with qtbot.waitSignal(model.dataChanged) as changed:
        assert model.toggle_reasoning(1) is True
    roles = changed.args[2]
    assert int(Qt.ItemDataRole.AccessibleTextRole) in roles
    assert model.index(0, 0).data(Qt.ItemDataRole.AccessibleTextRole).startswith(
        "Assistant, reasoning, 60 words")


def test_a_reasoning_reply_in_the_window(
    offline_window: Callable[[Tree], MainWindow], qtbot: QtBot
) -> None:
    tree = Tree("")
    question = tree.add_child(tree.root_id, Role.USER, "Hi")
    tree.add_child(question.id, Role.ASSISTANT, REPLY)
    cut = tree.add_child(tree.active_leaf, Role.USER, "And?")
    tree.add_child(cut.id, Role.ASSISTANT, "<think>\nHmm", status=NodeStatus.INTERRUPTED)
    win = offline_window(tree)
    chat = win.chat
    rows = chat.model().rows()
    chat.scroll_to_node(rows[1].node_id)
    assert painted_document(chat, rows[1].node_id).reasoning is not None
    toggle = next(a for a in win.findChildren(type(chat.action("toggle_reasoning")))
                  if a.objectName() == "chat_toggle_reasoning_action")
    assert toggle is chat.action("toggle_reasoning")
    chat.setFocus()
    chat.select_node(rows[1].node_id)
    assert toggle.isEnabled()
    toggle.trigger()
    assert chat.model().row_at(1).reasoning_shown is True
    last = painted_document(chat, rows[3].node_id)
    assert last.reasoning is not None and last.reasoning.label.startswith("Reasoning, unfinished")
    # Another conversation whose reply has the same node ids: its reasoning is folded, and
    # coming back finds this one's folded too (the choice is not kept across a switch).
    other = Tree("")
    other.add_child(other.add_child(other.root_id, Role.USER, "Hello").id, Role.ASSISTANT, REPLY)
    assert [r.node_id for r in chat.model().rows()[:2]] == [n.id for n in other.messages()]
    other_id = win.store.create(other, title="Other")
    assert win.controller.open_conversation(other_id)
    assert chat.model().row_at(0).text == "Hello"
    assert chat.model().row_at(1).reasoning_shown is None


def test_a_reply_that_only_mentions_the_closing_tag_is_shown_whole(view: ChatView) -> None:
    quoted = "Close it with `</think>`, then answer."
    view.set_rows([row(1, SAYS_CLOSE), row(2, quoted)])
    for node_id in (1, 2):
        doc = painted_document(view, node_id)
        assert doc.reasoning is None
        assert header(view, node_id).isEmpty()
        assert "reasoning" not in accessible_text(view.model().row_at(node_id - 1))
    assert painted_document(view, 2).toPlainText() == "Close it with </think>, then answer."


def test_a_reply_whose_prompt_opened_its_reasoning_streams_as_reasoning(
    view: ChatView,
) -> None:
    """The engine says the reply began inside its reasoning (its prompt ended with `<think>`):
    it is open reasoning from the first piece, and folds once the closing marker came."""
    view.set_rows([row(1, "Hi", role="user"), row(2, "", status="streaming")])
    view.update_text(2, "The user wants", reasoning_opened=True)
    doc = painted_document(view, 2)
    assert doc.reasoning is not None and doc.reasoning.shown
    assert doc.reasoning.label == "Reasoning… · 3 words"
    view.update_text(2, f"{THOUGHTS}\n</think>\n\nHello")  # the flag stays as it was
    doc = painted_document(view, 2)
    assert doc.reasoning is not None and not doc.reasoning.shown
    assert doc.reasoning.label == "Reasoning · 60 words"
    assert doc.toPlainText() == "Hello"


def test_the_window_folds_by_the_replys_stored_flag_alone(
    offline_window: Callable[[Tree], MainWindow]
) -> None:
    """Read from the store: `x</think>y` after a prompt that opened the reasoning folds; the
    same words without the flag, and a reply that mentions the tag, are shown whole."""
    tree = Tree("")
    question = tree.add_child(tree.root_id, Role.USER, "Hi")
    mentions = tree.add_child(question.id, Role.ASSISTANT, SAYS_CLOSE)
    unmarked = tree.add_sibling(mentions.id, "x</think>y")
    opened = tree.add_sibling(mentions.id, "x</think>y")
    opened.meta[OPENED] = True
    win = offline_window(tree)
    chat = win.chat
    doc = painted_document(chat, opened.id)
    assert doc.reasoning is not None and doc.toPlainText() == "y"
    assert doc.reasoning.label == "Reasoning · 1 word"
    for variant, other in enumerate((mentions, unmarked)):
        win.controller.switch_variant(opened.id, variant)
        assert chat.model().row_at(1).node_id == other.id
        doc = painted_document(chat, other.id)
        assert doc.reasoning is None  # (Markdown drops the tag itself, as raw HTML)
