"""The window's state without a window: `ChatController` and `Replies` on the scripted fake
engine (tests/fake_engine.py) through the in-process client, and the actions table every menu
reads. What the engine itself does is tested on the real one (tests/engine/service/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtGui import QKeySequence
from pytestqt.qtbot import QtBot

from app.look.actions import ACTIONS, TOOLBAR, Menu, Scope, shortcut_rows, spec, specs
from app.state.controller import ChatController
from engine.core.tree import NodeStatus, Role
from engine.service.protocol import GenerateRequest
from engine.storage.database import StoreWriteError
from engine.storage.store import Store
from tests.app_fixtures import TEST_SETTINGS, TIMEOUT, destroy
from tests.fake_engine import Script, in_process_client


@pytest.fixture
def controller(qtbot: QtBot, tmp_path: Path, fake_engine: Script,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[ChatController]:
    engine = in_process_client(fake_engine)
    controller = ChatController(Store(tmp_path / "c.db"), TEST_SETTINGS, engine)
    with qtbot.waitSignal(controller.replies.model_ready, timeout=TIMEOUT):
        controller.replies.load(str(tmp_path / "fake-model.gguf"))
    controller.open_first()
    yield controller
    engine.shutdown()
    controller.store.close()
    destroy(controller, engine)


def _answer(qtbot: QtBot, controller: ChatController, text: str) -> None:
    with qtbot.waitSignal(controller.replies.reply_finished, timeout=TIMEOUT):
        assert controller.send(text)


def test_the_controller_answers_persists_and_undoes_without_any_widget(
    qtbot: QtBot, controller: ChatController
) -> None:
    _answer(qtbot, controller, "Tell me about oaks.")
    _answer(qtbot, controller, "And their roots?")
    tree = controller.tree
    assert [n.role for n in tree.messages()] == [Role.USER, Role.ASSISTANT] * 2
    assert [n.text for n in tree.messages()] == [
        "Tell me about oaks.", "You said: Tell me about oaks.",
        "And their roots?", "You said: And their roots?"]
    assert all(n.status is NodeStatus.COMPLETE and n.tokens for n in tree.messages())
    stored = controller.store.load(controller.current or 0)
    assert [n.text for n in stored.messages()] == [n.text for n in tree.messages()]
    report = controller.replies.last_reply
    assert report is not None and report.reused_tokens + report.decoded_tokens == \
        report.prompt_tokens
    assert report.reused_tokens > 0  # the second prompt began with the first conversation

    second = tree.message(2).id
    controller.delete_branch(second)
    assert len(tree.messages()) == 2
    assert len(controller.store.load(controller.current or 0).messages()) == 2
    assert controller.can_undo
    controller.undo()
    assert [n.id for n in controller.tree.messages()][2] == second
    assert len(controller.store.load(controller.current or 0).messages()) == 4


def test_a_store_that_refuses_a_message_leaves_the_controller_as_it_was(
    qtbot: QtBot, controller: ChatController, monkeypatch: pytest.MonkeyPatch
) -> None:
    _answer(qtbot, controller, "Hello")
    before = [(n.id, n.text) for n in controller.tree.nodes()]
    leaf = controller.tree.active_leaf
    errors: list[str] = []
    controller.error.connect(errors.append)

    def full(*_args: object, **_kwargs: object) -> None:
        raise StoreWriteError("could not save the conversation: the disk is full")

    monkeypatch.setattr(Store, "save", full)
    assert not controller.send("Not saved")  # the composer keeps the text
    controller.set_system_prompt("Be terse.")
    assert errors == ["could not save the conversation: the disk is full"] * 2
    assert [(n.id, n.text) for n in controller.tree.nodes()] == before
    assert controller.tree.active_leaf == leaf and controller.tree.root.text == ""
    assert controller.replies.streaming is None


def test_a_refused_reply_node_starts_no_request(
    qtbot: QtBot, controller: ChatController, monkeypatch: pytest.MonkeyPatch,
    fake_engine: Script
) -> None:
    """The reply node is saved before the engine hears of it: if that save fails, the user
    message stays (it was saved) and nothing is sent to the engine."""
    saves = iter([None])  # the user message is saved; the reply node is not

    original = Store.save

    def second_fails(self: Store, *args: object, **kwargs: object) -> None:
        if next(saves, "fail") == "fail":
            raise StoreWriteError("could not save the conversation: the disk is full")
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "save", second_fails)
    assert controller.send("Hello")
    assert controller.replies.streaming is None
    assert [n.role for n in controller.tree.messages()] == [Role.USER]
    assert controller.tree.node(controller.tree.active_leaf).role is Role.USER
    assert not any(isinstance(r, GenerateRequest) for r in fake_engine.requests)


def test_every_action_is_in_one_table_with_unique_names_and_keys() -> None:
    names = [item.name for item in ACTIONS]
    assert len(names) == len(set(names))
    keys = [key for item in ACTIONS for key in item.keys]
    assert len(keys) == len(set(keys)), "a key bound to two actions"
    assert {item.name for item in specs(Scope.CHAT)} == {
        "edit", "regenerate", "rewind", "fork", "copy", "copy_code", "delete",
        "previous_variant", "next_variant", "toggle_reasoning"}
    assert all(item.menu is Menu.MESSAGE for item in specs(Scope.CHAT))
    assert all(name is None or spec(name).toolbar for name in TOOLBAR)
    rows = dict(shortcut_rows())
    assert rows["Undo"] == QKeySequence("Ctrl+Z").toString(
        QKeySequence.SequenceFormat.NativeText)
    assert "Send the message (in the composer)" in rows
