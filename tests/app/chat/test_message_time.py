"""A message shows when it was written on hover (the chat model's tooltip)."""

from __future__ import annotations

from datetime import datetime

from PySide6.QtCore import Qt

from app.chat.chat_model import ChatModel, message_time, rows_from_tree
from engine.core.tree import Role, Tree


def test_today_shows_the_time_and_earlier_days_the_date() -> None:
    now = datetime(2026, 12, 3, 18, 0).timestamp()
    assert message_time(datetime(2026, 12, 3, 9, 5).timestamp(), now) == "09:05"
    assert message_time(datetime(2026, 11, 30, 23, 59).timestamp(), now) == "2026-11-30 23:59"
    assert message_time(0.0, now) == ""


def test_the_chat_model_gives_each_message_its_time_as_tooltip() -> None:
    tree = Tree("sys")
    user = tree.add_child(tree.root_id, Role.USER, "hello")
    user.created = datetime(2020, 1, 2, 3, 4).timestamp()
    model = ChatModel()
    model.set_rows(rows_from_tree(tree))
    index = model.index(0, 0)
    assert model.data(index, Qt.ItemDataRole.ToolTipRole) == "2020-01-02 03:04"
    model.update_text(user.id, "hello again", "complete")
    assert model.data(index, Qt.ItemDataRole.ToolTipRole) == "2020-01-02 03:04"
