"""A conversation's own sampling, reply length and model: read leniently, saved with the
conversation (a restart, an export and import keep them), used by its replies, and its
model offered when it opens."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.dialogs.conversation_settings import SEED_FIXED, SEED_RANDOM, ConversationSettingsDialog
from app.window.main_window import MainWindow
from engine.config.overrides import OVERRIDES, Overrides
from engine.config.settings import Settings
from engine.core.tree import Role, Tree
from engine.service.protocol import GenerateRequest
from engine.storage.store import Store
from engine.storage.transfer import FileFormat, commit_import, export_file, parse_import
from tests.app_fixtures import TIMEOUT, send


def test_overrides_round_trip_and_keep_the_conversations_other_settings() -> None:
    mine = Overrides(temperature=0.2, seed=7, max_tokens=64, model="/m/a.gguf")
    settings = mine.write({"api_tree": "abc"})
    assert settings["api_tree"] == "abc" and Overrides.read(settings) == mine
    assert Overrides().write(settings) == {"api_tree": "abc"}  # the defaults store nothing
    greedy = Overrides(temperature=0.0, seed=0)  # values that equal False are values
    assert Overrides.read(greedy.write({})) == greedy
    applied = mine.apply(Settings(temperature=0.9, top_p=0.5, seed=None, max_tokens=512))
    assert (applied.temperature, applied.top_p, applied.seed, applied.max_tokens) == \
        (0.2, 0.5, 7, 64)
    assert Overrides(random_seed=True).apply(Settings(seed=3)).seed is None
    assert mine.describe() == "temperature 0.2, seed 7, max tokens 64, model a.gguf"


@pytest.mark.parametrize("raw", [
    {"temperature": "hot", "top_p": 7, "seed": -4, "max_tokens": 0, "model": ""},
    {"temperature": True, "seed": 1.5, "max_tokens": [3]},
    "not an object",
    None,
])
def test_invalid_override_values_are_left_out_never_fatal(raw: object) -> None:
    assert Overrides.read({OVERRIDES: raw}) == Overrides()


def test_valid_values_survive_beside_invalid_ones() -> None:
    read = Overrides.read({OVERRIDES: {"temperature": 1, "top_p": 9.0, "max_tokens": 32}})
    assert read == Overrides(temperature=1.0, max_tokens=32)


def test_overrides_survive_a_restart_and_an_export_and_import(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    store = Store(db)
    tree = Tree("")
    tree.add_child(tree.root.id, Role.USER, "Hello")
    cid = store.create(tree, title="Mine")
    mine = Overrides(temperature=0.3, random_seed=True, max_tokens=99)
    store.set_settings(cid, mine.write(store.settings(cid)))
    store.close()
    reopened = Store(db)
    assert Overrides.read(reopened.settings(cid)) == mine
    out = tmp_path / "export.arbor"
    export_file(reopened, [cid], out, FileFormat.NATIVE)
    other = Store(tmp_path / "other.db")
    (imported,) = commit_import(parse_import(out), other).conversation_ids
    assert Overrides.read(other.settings(imported)) == mine
    reopened.close()
    other.close()


def test_the_dialog_shows_defaults_and_returns_only_what_the_user_made_its_own(
    qtbot: QtBot
) -> None:
    defaults = Settings(temperature=0.7, top_p=0.95, seed=None, max_tokens=512)
    dialog = ConversationSettingsDialog(Overrides(max_tokens=64), defaults, "/m/a.gguf")
    qtbot.addWidget(dialog)
    assert not dialog.temperature.isEnabled() and dialog.temperature.value() == 0.7
    assert dialog.own_max_tokens.isChecked() and dialog.max_tokens.value() == 64
    assert dialog.chosen() == Overrides(max_tokens=64)
    dialog.own_temperature.setChecked(True)
    dialog.temperature.setValue(0.25)
    dialog.seed_mode.setCurrentIndex(SEED_FIXED)
    dialog.seed.setValue(42)
    dialog.choose_model("/m/b.gguf")
    assert dialog.chosen() == Overrides(temperature=0.25, seed=42, max_tokens=64,
                                        model="/m/b.gguf")
    dialog.seed_mode.setCurrentIndex(SEED_RANDOM)
    assert dialog.chosen().random_seed and dialog.chosen().seed is None
    dialog._use_defaults()
    assert dialog.chosen() == Overrides()


def test_the_other_samplers_are_a_conversations_own_and_reach_its_sampling(
    qtbot: QtBot
) -> None:
    """Top-k, min-p and the three penalties, as the API takes them: own values in the
    dialog, saved, read back (invalid ones left out), applied over the defaults."""
    defaults = Settings(top_k=40, repeat_penalty=1.0)
    dialog = ConversationSettingsDialog(Overrides(min_p=0.2), defaults, None)
    qtbot.addWidget(dialog)
    assert dialog.own_samplers["min_p"].isChecked() and dialog.samplers["min_p"].value() == 0.2
    assert not dialog.samplers["top_k"].isEnabled() and dialog.samplers["top_k"].value() == 40
    dialog.own_samplers["repeat_penalty"].setChecked(True)
    dialog.samplers["repeat_penalty"].setValue(1.15)
    dialog.own_samplers["top_k"].setChecked(True)
    dialog.samplers["top_k"].setValue(0)
    dialog.own_samplers["presence_penalty"].setChecked(True)
    dialog.samplers["presence_penalty"].setValue(-0.5)
    mine = dialog.chosen()
    assert mine == Overrides(top_k=0, min_p=0.2, repeat_penalty=1.15, presence_penalty=-0.5)
    assert Overrides.read(mine.write({})) == mine
    sampling = mine.apply(defaults).sampling()
    assert (sampling.top_k, sampling.min_p, sampling.repeat_penalty, sampling.presence_penalty,
            sampling.frequency_penalty) == (0, 0.2, 1.15, -0.5, 0.0)
    assert sampling.penalized
    assert "repeat penalty 1.15" in mine.describe()
    bad = {"top_k": 2.5, "min_p": 3, "repeat_penalty": 0, "presence_penalty": 9,
           "frequency_penalty": "x"}
    assert Overrides.read({OVERRIDES: bad}) == Overrides()


# --- in the window, on the fake engine ---------------------------------------------------


@pytest.fixture
def window_and_requests(
    fake_window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[MainWindow, list[GenerateRequest]]]:
    win = fake_window
    win.models.apply_settings(replace(win.settings, max_tokens=8, temperature=0.7, seed=None))
    sent: list[GenerateRequest] = []
    original = win.engine.send

    def record(request: object) -> None:
        if isinstance(request, GenerateRequest):
            sent.append(request)
        original(request)  # type: ignore[arg-type]

    monkeypatch.setattr(win.engine, "send", record)
    yield win, sent


def test_a_conversations_replies_use_its_own_settings_and_others_the_defaults(
    qtbot: QtBot, window_and_requests: tuple[MainWindow, list[GenerateRequest]]
) -> None:
    window, sent = window_and_requests
    assert window.controller.set_overrides(Overrides(temperature=0.0, seed=11, max_tokens=3))
    assert "temperature 0, seed 11, max tokens 3" in window.statusBar().currentMessage()
    send(qtbot, window, "Hello")
    reply = window.tree.messages()[-1]
    assert reply.role is Role.ASSISTANT and len(reply.tokens or ()) <= 3 + 8  # template tail
    mine = sent[-1]
    assert (mine.max_tokens, mine.seed) == (3, 11)
    assert mine.sampling is not None and mine.sampling.temperature == 0.0
    window.controller.new_conversation()
    send(qtbot, window, "Hello again")
    other = sent[-1]
    assert other.max_tokens == 8 and other.sampling is None  # the defaults, as configured


def test_opening_a_conversation_set_to_another_model_offers_to_load_it(
    qtbot: QtBot, window_and_requests: tuple[MainWindow, list[GenerateRequest]],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    window, _ = window_and_requests
    asked: list[str] = []
    answer = [QMessageBox.StandardButton.No]
    monkeypatch.setattr("app.window.main_window.QMessageBox.question",
                        lambda _p, _t, text: asked.append(text) or answer[0])
    first = window.controller.current
    assert first is not None
    other = tmp_path / "tiny-recurrent.gguf"
    other.write_bytes(b"GGUF")  # offered only if it is there; the fake engine loads any file
    other_model = str(other)
    window.controller.set_overrides(Overrides(model=other_model))
    window.controller.new_conversation()
    window.controller.open_conversation(first)
    assert len(asked) == 1 and "tiny-recurrent.gguf" in asked[0]
    window.controller.new_conversation()
    window.controller.open_conversation(first)
    assert len(asked) == 1  # said no: not asked again in this session
    window._models_declined.clear()
    answer[0] = QMessageBox.StandardButton.Yes
    window.controller.new_conversation()
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):
        window.controller.open_conversation(first)
    assert window.replies.model_path == other_model and len(asked) == 2
