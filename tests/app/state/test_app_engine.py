"""The window and its engine: warming the next prompt, settings, models, shortcuts, a reply
while the user does something else, and store errors. What the real engine decides (what a
warm-up decodes, a fixed seed, checkpoints in a session file, a bug in it) runs on a real one;
what the window does with the engine's events runs on the scripted fake (tests/fake_engine.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from pytestqt.qtbot import QtBot

from app.dialogs.model_picker import Column, ModelPicker
from app.dialogs.settings_dialog import SettingsDialog
from app.window.main_window import MainWindow
from engine.config.settings import Effect, Settings, load_settings
from engine.core.tree import NodeStatus, Role
from engine.files.paths import data_dirs
from engine.llm.generator import Generator
from engine.llm.llama import FlashAttention
from engine.service.protocol import Warmed, WarmRequest
from engine.storage.database import StoreWriteError
from engine.storage.store import Store
from engine.storage.transfer import FileFormat
from tests.app_fixtures import TIMEOUT, process_gone, send
from tests.fake_engine import Script, in_process_client


def _wait_warm(qtbot: QtBot, win: MainWindow) -> Warmed:
    with qtbot.waitSignal(win.warmed, timeout=TIMEOUT) as blocker:
        pass
    warmed = blocker.args[0]
    assert isinstance(warmed, Warmed)
    return warmed


def test_after_a_reply_the_engine_warms_the_branch_and_send_decodes_only_the_new_message(
    qtbot: QtBot, window: MainWindow
) -> None:
    with qtbot.waitSignal(window.warmed, timeout=TIMEOUT) as first:
        send(qtbot, window, "Tell me about rivers.")
    warmed = first.args[0]
    tree = window.tree
    leaf = tree.node(tree.active_leaf)
    assert leaf.role is Role.ASSISTANT
    assert warmed.last_node == leaf.id
    assert warmed.report is not None
    assert warmed.report.decoded_tokens >= 2  # the reply, decoded again in one batch
    before = sum(len(node.tokens or ()) for node in tree.path_to(leaf.id))
    assert warmed.prompt_tokens == before
    assert window.progress_label.text().startswith("Ready:")
    assert "reused" in window.statusBar().currentMessage()  # the step's figures stay
    # The warm-up's checkpoint at the reply's end is marked in both views.
    model = window.chat.model()
    qtbot.waitUntil(lambda: model.row_at(model.rowCount() - 1).checkpoint == "ram",
                    timeout=TIMEOUT)
    assert window.tree_panel.node_item(leaf.id).toolTip().count("checkpoint") >= 1

    send(qtbot, window, "And lakes?")
    done = window.replies.last_reply
    assert done is not None and done.source == "live"
    assert done.reused_tokens == before  # everything up to the new message was ready
    user = window.tree.node(window.tree.node(window.tree.active_leaf).parent or 0)
    assert done.decoded_tokens == done.prompt_tokens - before
    assert done.decoded_tokens > len(user.tokens or ())  # the message and the reply's header


def test_starting_an_edit_warms_the_prefix_before_the_edited_message(
    qtbot: QtBot, window: MainWindow
) -> None:
    send(qtbot, window, "First question")
    send(qtbot, window, "Second question")
    _wait_warm(qtbot, window)
    second_user = window.tree.message(2)
    with qtbot.waitSignal(window.warmed, timeout=TIMEOUT) as blocker:
        window.replies.start_editing(second_user.id)
    assert blocker.args[0].last_node == second_user.parent
    window.controller.edit(second_user.id, "A better second question")
    qtbot.waitUntil(lambda: window.replies.streaming is None, timeout=TIMEOUT)
    done = window.replies.last_reply
    assert done is not None and done.source == "live"
    assert done.reused_tokens == sum(
        len(n.tokens or ()) for n in window.tree.path_to(second_user.parent or 0))


def test_a_context_setting_reloads_the_model_says_so_and_is_saved(
    qtbot: QtBot, fake_window: MainWindow
) -> None:
    send(qtbot, fake_window, "Hello")
    with qtbot.waitSignal(fake_window.model_ready, timeout=TIMEOUT):
        effect = fake_window.models.apply_settings(replace(fake_window.settings, n_ctx=2048))
        assert effect is Effect.INVALIDATE
        assert "checkpoints do not fit" in fake_window.statusBar().currentMessage()
    assert "ctx 2048" in fake_window.status_model.text()
    assert load_settings().settings.n_ctx == 2048
    send(qtbot, fake_window, "Still there?")  # the new context answers
    done = fake_window.replies.last_reply
    assert done is not None and done.reused_tokens == 0  # a new context holds nothing


def test_sampling_settings_apply_without_a_reload_and_a_fixed_seed_repeats_a_conversation(
    qtbot: QtBot, window: MainWindow
) -> None:
    """With a fixed seed the n-th reply of a conversation gets seed + n (the core's rule,
    as in replay): the same operations give the same replies, and a regenerate differs."""
    with qtbot.assertNotEmitted(window.model_ready, wait=200):
        assert window.models.apply_settings(
            replace(window.settings, temperature=1.2, seed=1234, max_tokens=12)
        ) is Effect.LIVE
    send(qtbot, window, "Say something")
    first = window.tree.node(window.tree.active_leaf)
    window.controller.regenerate(first.id)
    qtbot.waitUntil(lambda: window.replies.streaming is None, timeout=TIMEOUT)
    second = window.tree.node(window.tree.active_leaf)
    assert second.id != first.id and second.tokens != first.tokens
    assert len(second.tokens or ()) <= len(first.tokens or ()) + 1  # at most 12 generated
    window.controller.new_conversation()
    send(qtbot, window, "Say something")
    again = window.tree.node(window.tree.active_leaf)
    assert again.text == first.text  # the first reply of a conversation: seed 1234 + 0


def test_the_settings_dialog_says_what_a_change_costs(qtbot: QtBot) -> None:
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    assert dialog.effect() is Effect.NONE
    dialog.temperature.setValue(0.2)
    assert dialog.effect() is Effect.LIVE and "at once" in dialog.effect_label.text()
    dialog.n_gpu_layers.setValue(-1)
    assert dialog.effect() is Effect.RELOAD
    dialog.n_ctx.setValue(8192)
    assert dialog.effect() is Effect.INVALIDATE
    assert "checkpoints" in dialog.effect_label.text()
    dialog.type_v.setCurrentText("q8_0")  # needs flash attention
    ok = dialog.buttons.button(dialog.buttons.StandardButton.Ok)
    assert not ok.isEnabled() and "flash attention" in dialog.effect_label.text()
    dialog.flash_attn.setCurrentIndex(list(FlashAttention).index(FlashAttention.ON))
    assert ok.isEnabled()
    chosen = dialog.chosen()
    assert (chosen.n_ctx, chosen.type_v, chosen.flash_attn) == (8192, "q8_0", FlashAttention.ON)


def test_the_model_picker_reads_headers_and_refuses_broken_files(
    qtbot: QtBot, qtmodeltester, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 7)
    paths = [tiny_models["dense"], tiny_models["recurrent"], tiny_models["sliding_window"],
             broken]
    picker = ModelPicker(str(tiny_models["recurrent"]), paths=paths)
    qtbot.addWidget(picker)
    qtmodeltester.check(picker.model)
    model = picker.model

    def cell(row: int, column: Column) -> str:
        return str(model.data(model.index(row, column)))

    assert cell(1, Column.MEMORY) == "recurrent"
    assert cell(0, Column.MEMORY) == "dense"
    assert cell(2, Column.MEMORY).startswith("sliding window")
    assert cell(0, Column.ARCHITECTURE) == "llama" and cell(1, Column.ARCHITECTURE) == "mamba"
    assert cell(0, Column.SIZE).endswith("MiB")
    assert "cannot be used" in cell(3, Column.NAME)
    assert picker.chosen() == tiny_models["dense"]  # the first usable row
    picker.select_row(3)
    assert picker.chosen() is None and not picker.load_button.isEnabled()
    picker.add_file(tiny_models["dense"])  # a file already listed is found, not added twice
    assert model.rowCount() == 4 and picker.chosen() == tiny_models["dense"]


def test_every_frequent_action_has_its_own_shortcut(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    win = MainWindow(store=Store(tmp_path / "c.db"),
                     engine=in_process_client(Script()))
    qtbot.addWidget(win)
    keys: dict[str, list[str]] = {}
    for action in [*win.actions_by_name.values(), *win.chat.actions()]:
        for sequence in action.shortcuts():
            keys.setdefault(sequence.toString(), []).append(action.text())
    clashes = {k: sorted(set(v)) for k, v in keys.items() if len(set(v)) > 1}
    assert not clashes, clashes
    table = dict(win.shortcut_table())
    for name in ("New conversation", "Settings", "Models", "Import", "Undo",
                 "Continue the reply", "Regenerate the last reply", "System prompt",
                 "Search conversations", "Next conversation", "Stop", "Keyboard shortcuts",
                 "Edit", "Regenerate", "Rewind here", "Fork from here", "Delete branch",
                 "Previous version", "Next version"):
        assert name in table, name
    assert table["Settings"] == QKeySequence("Ctrl+,").toString(
        QKeySequence.SequenceFormat.NativeText)
    win.close()


def test_the_system_prompt_is_per_conversation_and_saved(
    qtbot: QtBot, fake_window: MainWindow
) -> None:
    first = fake_window.current
    fake_window.controller.set_system_prompt("Answer in French.")
    fake_window.controller.new_conversation()
    assert fake_window.tree.root.text == ""
    fake_window.controller.open_conversation(first or 0)
    assert fake_window.tree.root.text == "Answer in French."
    assert fake_window.store.load(first or 0).root.text == "Answer in French."
    send(qtbot, fake_window, "Hello")
    assert fake_window.tree.root.tokens  # rendered with the new text for this reply


def _sidebar_texts(win: MainWindow) -> list[str]:
    return [win.sidebar.list.item(i).text() for i in range(win.sidebar.list.count())]


def _send_held(qtbot: QtBot, win: MainWindow, script: Script, text: str) -> None:
    """Send `text` and return once its reply shows its first word: the fake engine holds
    the rest until the reply is stopped."""
    script.hold = True
    win.composer.setPlainText(text)
    with qtbot.waitSignal(win.text_shown, timeout=TIMEOUT):
        qtbot.keyClick(win.composer, Qt.Key.Key_Return)


def test_a_reply_streams_into_its_own_conversation_while_another_is_open(
    qtbot: QtBot, fake_window: MainWindow, fake_engine: Script
) -> None:
    send(qtbot, fake_window, "Hello")
    first = fake_window.current or 0
    _send_held(qtbot, fake_window, fake_engine, "Tell me a long story")
    fake_window.controller.new_conversation()  # browse elsewhere while it answers
    second = fake_window.current
    assert second != first and fake_window.chat.model().rowCount() == 0
    marked = _sidebar_texts(fake_window)
    assert any(text.endswith("●") for text in marked)  # the answering one is marked
    fake_window.replies.stop()
    qtbot.waitUntil(lambda: fake_window.replies.streaming is None, timeout=TIMEOUT)
    assert fake_window.current == second and fake_window.chat.model().rowCount() == 0
    tree = fake_window.controller.conversations[first].tree
    reply = tree.node(tree.active_leaf)
    assert reply.role is Role.ASSISTANT and reply.text == "You"  # its first word, kept
    assert fake_window.store.load(first).node(reply.id).text == reply.text
    marked = _sidebar_texts(fake_window)
    assert not any(text.endswith("●") for text in marked)


def test_after_a_stop_the_engine_warms_the_continue_and_continue_decodes_nothing(
    qtbot: QtBot, fake_window: MainWindow, fake_engine: Script
) -> None:
    send(qtbot, fake_window, "Hello")
    _send_held(qtbot, fake_window, fake_engine, "Tell me a long story")
    reply = fake_window.tree.node(fake_window.tree.active_leaf)
    asked = reply.parent
    # The warm-up for the continue ends with the message the reply answers (one of the
    # branch before it, already on its way, ends with the first reply).
    with qtbot.waitSignal(fake_window.warmed, timeout=TIMEOUT,
                          check_params_cb=lambda warmed: warmed.last_node == asked):
        fake_window.replies.stop()
    assert reply.status is NodeStatus.INTERRUPTED and reply.text == "You"
    warm = [r for r in fake_engine.requests if isinstance(r, WarmRequest)][-1]
    assert warm.resume is not None and warm.resume.id == reply.id
    assert warm.resume.text == reply.text and warm.path[-1].id == asked
    with qtbot.waitSignal(fake_window.reply_finished, timeout=TIMEOUT):
        fake_window.controller.continue_reply()
    done = fake_window.replies.last_reply
    assert done is not None and done.decoded_tokens == 0 and done.reused_tokens > 0
    assert reply.status is NodeStatus.COMPLETE and reply.text.startswith("You ")


def test_an_edit_sent_during_a_reply_stops_it_and_is_answered(
    qtbot: QtBot, fake_window: MainWindow, fake_engine: Script
) -> None:
    send(qtbot, fake_window, "First question")
    _send_held(qtbot, fake_window, fake_engine, "Second question, with a long answer")
    interrupted = fake_window.tree.node(fake_window.tree.active_leaf)
    assert interrupted.text == "You"  # streamed so far: the engine holds the rest
    first = fake_window.tree.message(0)
    with qtbot.waitSignal(fake_window.reply_finished, timeout=TIMEOUT):
        fake_window.controller.edit(first.id, "First question, edited")  # not lost, not refused
    qtbot.waitUntil(lambda: fake_window.replies.streaming is None, timeout=TIMEOUT)
    assert interrupted.status.value == "interrupted"
    tree = fake_window.tree
    assert tree.message(0).text == "First question, edited"
    assert tree.siblings(tree.message(0).id) == [first.id, tree.message(0).id]
    assert tree.message(1).role is Role.ASSISTANT
    assert tree.message(1).text == "You said: First question, edited"


def test_a_session_file_carries_its_checkpoints_to_another_installation(
    qtbot: QtBot, window: MainWindow, tiny_models: dict[str, Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Export with checkpoints on one machine, import on a fresh one: the first reply there
    restores the imported state instead of reading the conversation from the start."""
    send(qtbot, window, "Tell me about rivers, at length, please.")
    _wait_warm(qtbot, window)
    out = tmp_path / "rivers.arbor"
    with qtbot.waitSignal(window.files.export_finished, timeout=TIMEOUT) as exported:
        window.files.export_current(out, FileFormat.NATIVE)
    done = exported.args[0]
    assert done.error is None and done.checkpoints >= 1
    texts = [n.text for n in window.tree.messages()]

    # Another installation: its own home (no checkpoints, another session key is fine for
    # the tree but not for the checkpoints' tag, so the key travels as the user's would).
    key = (data_dirs().config / "session-key").read_bytes()
    other_home = tmp_path / "other-home"
    monkeypatch.setenv("ARBOR_HOME", str(other_home))
    (other_home / "config").mkdir(parents=True)
    (other_home / "config" / "session-key").write_bytes(key)
    other = MainWindow(store=Store(other_home / "c.db"), settings=window.settings)
    qtbot.addWidget(other)
    with qtbot.waitSignal(other.model_ready, timeout=TIMEOUT):
        other.models.load_model(str(tiny_models["dense"]))
    with qtbot.waitSignal(other.files.import_finished, timeout=TIMEOUT) as imported:
        other.files.import_path(out)
    assert len(imported.args[0]) == 1
    assert "with " in other.statusBar().currentMessage()
    assert [n.text for n in other.tree.messages()] == texts
    other.controller.new_conversation()  # keep the warm-up away from the imported branch
    other.controller.open_conversation(imported.args[0][0])
    other.replies._warm_timer.stop()
    other.engine.preempt()
    before = sum(len(n.tokens or ()) for n in other.tree.active_path())
    assert before > 0
    send(qtbot, other, "And lakes?")
    assert other.replies.last_reply is not None and other.replies.last_reply.source == "checkpoint"
    assert other.replies.last_reply.reused_tokens == before  # the whole imported branch
    other_pid = other.replies.engine_pid
    other.close()
    assert other_pid is not None and other_pid != window.replies.engine_pid
    assert process_gone(other_pid)


def test_an_internal_error_during_a_reply_is_reported_and_the_window_recovers(
    qtbot: QtBot, thread_window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the engine (here on a thread of this process, to plant it) ends the reply
    with one message; the engine keeps answering."""
    window = thread_window
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a bug")

    original = Generator.generate
    monkeypatch.setattr(Generator, "generate", broken)
    window.composer.setPlainText("Hello")
    with qtbot.waitSignal(window.reply_finished, timeout=TIMEOUT):
        qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    assert len(shown) == 1 and "internal error" in shown[0] and "Traceback" not in shown[0]
    assert window.replies.streaming is None and window.send_button.text() == "Send"
    assert [m.role for m in window.tree.messages()] == [Role.USER]  # no empty reply kept
    monkeypatch.setattr(Generator, "generate", original)  # the engine_calls watch stays
    send(qtbot, window, "Hello again")  # the engine still answers
    assert window.tree.messages()[-1].role is Role.ASSISTANT


def test_a_message_the_store_refuses_leaves_the_window_as_saved(
    qtbot: QtBot, fake_window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: one clear message, the composer keeps the text, and the fake_window shows
    exactly what is in the database."""
    send(qtbot, fake_window, "Hello")
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))
    real_save = Store.save

    def full(*_args: object, **_kwargs: object) -> None:
        raise StoreWriteError("the disk is full; nothing was saved")

    monkeypatch.setattr(Store, "save", full)
    before = [n.text for n in fake_window.tree.messages()]
    fake_window.composer.setPlainText("This will not fit")
    qtbot.keyClick(fake_window.composer, Qt.Key.Key_Return)
    fake_window.controller.edit(fake_window.tree.message(0).id, "Neither will this")
    assert shown == ["the disk is full; nothing was saved"] * 2
    assert fake_window.replies.streaming is None
    assert [n.text for n in fake_window.tree.messages()] == before
    assert fake_window.chat.model().rowCount() == len(before)
    assert fake_window.composer.toPlainText() == "This will not fit"
    monkeypatch.setattr(Store, "save", real_save)
    assert [n.text for n in fake_window.store.load(fake_window.current or 0).messages()] == before


@pytest.mark.parametrize("failing", ["create", "load", "rename", "delete", "fork", "save"])
def test_a_store_error_anywhere_leaves_the_window_consistent_with_one_message(
    qtbot: QtBot, fake_window: MainWindow, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """The fake_window used to keep `False` as a tree or as the current conversation after a
    failed load or create, and the next access raised AttributeError."""
    send(qtbot, fake_window, "Hello there.")
    first = fake_window.current
    assert first is not None
    fake_window.controller.new_conversation()
    second = fake_window.current
    assert second is not None and second != first
    # Not loaded yet in this fake_window: opening it reads the store.
    fake_window.controller.conversations.pop(first)
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda _parent, _title, text: shown.append(text))
    monkeypatch.setattr("app.window.main_window.QInputDialog.getText",
                        lambda *_args: ("A new title", True))

    def broken(*_args: object, **_kwargs: object) -> None:
        raise StoreWriteError("could not save the conversation: the disk is full")

    monkeypatch.setattr(Store, failing, broken)
    before = (fake_window.current, dict(fake_window.controller.conversations))
    if failing == "create":
        fake_window.controller.new_conversation()
    elif failing == "load":
        fake_window.controller.open_conversation(first)
    elif failing == "rename":
        fake_window._rename(second)
    elif failing == "delete":
        fake_window.controller.delete_conversation(second)
    elif failing == "fork":
        fake_window.controller.fork(fake_window.tree.active_leaf)
    elif failing == "save":
        fake_window.composer.setPlainText("Not saved")
        qtbot.keyClick(fake_window.composer, Qt.Key.Key_Return)
    assert shown == ["could not save the conversation: the disk is full"]
    assert (fake_window.current, dict(fake_window.controller.conversations)) == before
    opened = fake_window.controller.conversations.values()
    assert all(isinstance(c.tree, type(fake_window.tree)) for c in opened)
    monkeypatch.undo()  # the store works again: the fake_window goes on as if nothing happened
    fake_window.controller.open_conversation(first)
    assert fake_window.current == first and fake_window.tree.messages()[0].text == "Hello there."
    fake_window.controller.new_conversation()
    assert isinstance(fake_window.current, int) and fake_window.current not in (first, second)


def test_the_tokens_a_warm_up_renders_are_kept_and_saved(
    qtbot: QtBot, fake_window: MainWindow
) -> None:
    """An imported conversation has no tokens yet; warming it renders them once, and the
    request that follows uses those (it renders nothing again)."""
    from engine.core.tree import Tree

    tree = Tree("Be brief.")
    tree.add_child(tree.active_leaf, Role.USER, "What is a delta?")
    tree.add_child(tree.active_leaf, Role.ASSISTANT, "Where a river meets the sea.")
    cid = fake_window.store.create(tree, title="Imported")
    with qtbot.waitSignal(fake_window.warmed, timeout=TIMEOUT) as blocker:
        fake_window.controller.open_conversation(cid)
    warmed = blocker.args[0]
    assert isinstance(warmed, Warmed) and len(warmed.rendered) == 3
    kept = [node.tokens for node in fake_window.tree.active_path()]
    assert all(kept)
    assert [n.tokens for n in fake_window.store.load(cid).active_path()] == kept
    send(qtbot, fake_window, "And an estuary?")
    path = fake_window.tree.active_path()
    assert [n.tokens for n in path[:3]] == kept
    done = fake_window.replies.last_result
    assert done is not None  # only the new message was rendered by the request
    assert [key for key, _ in done.rendered] == [path[3].id]
