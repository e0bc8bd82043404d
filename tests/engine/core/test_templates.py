"""Chat templates: the file's own, llama.cpp's built-in one by architecture, or the user's pick,
applied to new nodes only."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.dialogs.model_picker import Column, ModelPicker
from app.window.main_window import MainWindow
from engine.config.settings import Settings, SettingsError
from engine.core.prompt import TemplateError
from engine.core.templates import (
    MODEL_TEMPLATE,
    TemplateOrigin,
    builtin_for_architecture,
    choose_template,
    template_options,
)
from engine.llm.generator import Generator
from engine.llm.llama import (
    LlamaModel,
    SamplingParams,
    apply_builtin_template,
    builtin_template_names,
)
from engine.service.session import GenerationOptions, Session
from tests.app_fixtures import TIMEOUT, send
from tests.conftest import RuntimeFactory

BUILTIN = builtin_template_names()
GREEDY = SamplingParams(temperature=0.0)


def test_llama_cpp_knows_templates_by_name_and_renders_them() -> None:
    assert {"chatml", "gemma", "llama3", "phi3"} <= set(BUILTIN)
    text = apply_builtin_template(
        "gemma", [{"role": "user", "content": "Hi"}], add_generation_prompt=True
    )
    assert text == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    with pytest.raises(ValueError, match="no built-in chat template named 'nope'"):
        apply_builtin_template("nope", [{"role": "user", "content": "Hi"}],
                               add_generation_prompt=True)


@pytest.mark.parametrize(
    ("architecture", "expected"),
    [("gemma3", "gemma"), ("gemma2", "gemma"), ("phi3", "phi3"), ("llama", None),
     ("mamba", None), ("exaone4", "exaone4")],
)
def test_the_built_in_template_follows_the_architecture(
    architecture: str, expected: str | None
) -> None:
    assert builtin_for_architecture(architecture, BUILTIN) == expected


def test_the_choice_prefers_the_users_pick_then_the_file_then_llama_cpp_then_chatml() -> None:
    def choose(embedded: str | None, arch: str, chosen: str | None) -> tuple[str, str]:
        c = choose_template(embedded=embedded, architecture=arch, chosen=chosen, builtin=BUILTIN)
        return c.name, c.origin.value

    assert choose("{{x}}", "gemma3", None) == (MODEL_TEMPLATE, "model")
    assert choose(None, "gemma3", None) == ("gemma", "builtin")
    assert choose(None, "mamba", None) == ("chatml", "fallback")
    assert choose("{{x}}", "llama", "llama3") == ("llama3", "chosen")
    assert choose("{{x}}", "llama", MODEL_TEMPLATE) == (MODEL_TEMPLATE, "chosen")
    # A pick that no longer applies is ignored, never an error.
    assert choose(None, "gemma3", MODEL_TEMPLATE) == ("gemma", "builtin")
    assert choose(None, "gemma3", "gone-in-this-build") == ("gemma", "builtin")
    assert template_options(None, ["b", "a"]) == ["a", "b"]
    assert template_options("{{x}}", ["a"]) == [MODEL_TEMPLATE, "a"]


def test_the_template_chosen_per_model_file_is_saved_in_the_settings(tmp_path: Path) -> None:
    settings = Settings().with_template(tmp_path / "m.gguf", "gemma")
    assert settings.template_for(str(tmp_path / "m.gguf")) == "gemma"
    assert settings.template_for(tmp_path / "other.gguf") is None
    again = Settings.from_json(settings.to_json())
    assert again.templates == settings.templates
    assert again.with_template(tmp_path / "m.gguf", None).templates == {}
    with pytest.raises(SettingsError, match="templates"):
        Settings.from_json({"templates": {"a": 3}})


def test_a_template_chosen_after_messages_exist_applies_to_new_nodes_only(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """The earlier nodes keep their tokens, so the conversation's prefix (and its
    checkpoints) stay valid; the invariant holds across the change."""
    runtime = make_runtime(tiny_models["dense"], n_ctx=2048, n_batch=64)
    reference_rt = make_runtime(tiny_models["dense"], n_ctx=2048, n_batch=64)
    cached = Session(runtime, system="Be brief.", sampling=GREEDY, seed=3)
    reference = Session(reference_rt, system="Be brief.", sampling=GREEDY, seed=3,
                        use_cache=False)
    for session in (cached, reference):
        session.send("What is an oak?", GenerationOptions(max_tokens=6))
    before = [node.tokens for node in cached.tree.active_path()]
    for session in (cached, reference):
        choice = session.generator.use_template("gemma")
        assert (choice.name, choice.origin) == ("gemma", TemplateOrigin.CHOSEN)
    mine = cached.send("And a river?", GenerationOptions(max_tokens=6))
    theirs = reference.send("And a river?", GenerationOptions(max_tokens=6))
    path = cached.tree.active_path()
    assert [node.tokens for node in path[: len(before)]] == before
    new_user = path[len(before)]
    assert new_user.tokens is not None
    model = runtime.model
    rendered = "".join(model.token_text(t) for t in new_user.tokens)
    assert rendered.startswith("<start_of_turn>user\nAnd a river?")
    assert mine.text == theirs.text
    # Reused: everything up to the end of the old prompt (the old reply's opening, rendered
    # by the old template: the reply keeps where it ends).
    old_reply = path[len(before) - 1]
    opening = old_reply.meta["prompt_len"]
    assert isinstance(opening, int)
    assert mine.report is not None
    assert mine.report.reused_tokens == sum(len(t or ()) for t in before[:-1]) + opening


def test_a_model_without_a_template_uses_llama_cpps_and_a_bad_pick_is_a_clear_error(
    gemma_path: Path, make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(gemma_path, n_ctx=512, n_batch=64)
    assert runtime.model.chat_template() is None
    generator = Generator(runtime)
    assert (generator.template.name, generator.template.origin) == ("gemma", TemplateOrigin.BUILTIN)
    assert "built-in" in generator.template.describe()
    chosen = Generator(runtime, template="chatml")
    assert (chosen.template.name, chosen.template.origin) == ("chatml", TemplateOrigin.CHOSEN)
    with pytest.raises(TemplateError):
        from engine.core.prompt import BuiltinTemplate

        BuiltinTemplate("nope", apply_builtin_template).render([], add_generation_prompt=True)


def test_the_model_picker_shows_and_picks_the_chat_template_per_file(
    qtbot: QtBot, tiny_models: dict[str, Path], gemma_path: Path
) -> None:
    settings = Settings().with_template(tiny_models["dense"], "llama3")
    picker = ModelPicker(None, paths=[tiny_models["dense"], gemma_path], settings=settings,
                         builtin=BUILTIN)
    qtbot.addWidget(picker)
    model = picker.model

    def cell(row: int) -> str:
        return str(model.data(model.index(row, Column.TEMPLATE)))

    assert cell(0) == "llama3 (chosen)"
    assert cell(1) == "gemma (llama.cpp built-in)"
    tip = model.data(model.index(1, Column.TEMPLATE), Qt.ItemDataRole.ToolTipRole)
    assert "llama.cpp's built-in for this architecture (none in the file)" in tip
    assert picker.chosen_template() == "llama3"
    box = picker.template_box
    assert box.itemText(0).startswith("Automatic: the model's own")
    box.setCurrentIndex(0)  # back to automatic
    assert picker.chosen_template() is None and cell(0) == "model's own"
    picker.select_row(1)
    assert picker.chosen() == gemma_path and picker.chosen_template() is None
    box.setCurrentIndex(box.findData("chatml"))
    assert picker.chosen_template() == "chatml" and cell(1) == "chatml (chosen)"
    assert box.findData(MODEL_TEMPLATE) == -1  # the file has none to offer


def test_choosing_a_template_for_the_loaded_model_applies_without_a_reload(
    qtbot: QtBot, window: MainWindow, tiny_models: dict[str, Path]
) -> None:
    send(qtbot, window, "Hello there.")
    loads: list[bool] = []
    window.model_ready.connect(lambda: loads.append(True))
    window.models.choose_model(tiny_models["dense"], "gemma")
    assert window.settings.template_for(tiny_models["dense"]) == "gemma"
    qtbot.waitUntil(lambda: "gemma" in window.status_model.toolTip(), timeout=TIMEOUT)
    assert "'gemma' (chosen for this file)" in window.statusBar().currentMessage()
    first = [node.tokens for node in window.tree.active_path()]
    send(qtbot, window, "And again?")
    path = window.tree.active_path()
    assert [node.tokens for node in path[: len(first)]] == first
    new_user = path[len(first)]
    vocabulary = LlamaModel(tiny_models["dense"])  # the engine's is in its own process
    try:
        model_text = "".join(vocabulary.token_text(t) for t in new_user.tokens or ())
    finally:
        vocabulary.close()
    assert model_text.startswith("<start_of_turn>user\nAnd again?")
    # No reload: the same context, and the reply reused the conversation so far.
    assert loads == []
    assert window.replies.last_reply is not None and window.replies.last_reply.reused_tokens > 0
