"""A new conversation takes its title from its first message."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from app.window.main_window import MainWindow
from engine.core.titles import MAX_TITLE, NEW_TITLE, title_from
from tests.app_fixtures import send


@pytest.mark.parametrize(("text", "title"), [
    ("What is the capital of France?", "What is the capital of France?"),
    ("\n\n  # Plan:\nsteps follow", "Plan"),
    ("- make a list.", "make a list"),
    ("```\n```\n", NEW_TITLE),
    ("   ", NEW_TITLE),
    ("Tell me everything about the rivers of Europe and their deltas, please",
     "Tell me everything about the rivers of Europe…"),
    ("x" * 100, "x" * MAX_TITLE + "…"),
])
def test_the_title_is_the_first_line_with_words_cut_at_a_word(text: str, title: str) -> None:
    assert title_from(text) == title
    assert len(title_from(text)) <= MAX_TITLE + 1


def test_the_first_message_names_the_conversation_and_a_chosen_name_stays(
    qtbot: QtBot, fake_window: MainWindow
) -> None:
    c = fake_window.controller
    c.new_conversation()
    first = c.current
    assert first is not None and fake_window.store.title(first) == NEW_TITLE
    send(qtbot, fake_window, "How do deltas form?\nAnd why there?")
    assert fake_window.store.title(first) == "How do deltas form?"
    send(qtbot, fake_window, "Something else entirely")
    assert fake_window.store.title(first) == "How do deltas form?"
    assert "How do deltas form?" in [info.title for info in c.listing()[0]]
    c.new_conversation()
    second = c.current
    assert second is not None
    c.rename(second, "Mine")
    send(qtbot, fake_window, "A question")
    assert fake_window.store.title(second) == "Mine"
