"""A conversation's own settings: sampling, reply length, what happens when it outgrows the
context, and model, each either the default (shown, so the user sees what they would change)
or the conversation's own value.

The dialog edits a copy; the owner saves what `chosen()` returns (see engine.config.overrides).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.dialogs.samplers import SAMPLERS, editor_values, sampler_editor
from app.dialogs.tool_picker import ToolPicker
from engine.config.overrides import Overrides
from engine.config.settings import Settings
from engine.core.overflow import Overflow

SEED_DEFAULT, SEED_RANDOM, SEED_FIXED = range(3)
OVERFLOW_TIP = ("When the branch no longer fits the context: stop with a message, or leave the "
                "oldest messages after the system prompt out (they stay in the conversation, "
                "marked in the chat; the model no longer reads them).")


class ConversationSettingsDialog(QDialog):
    def __init__(self, overrides: Overrides, defaults: Settings, loaded_model: str | None,
                 parent: QWidget | None = None, *, tools: ToolPicker | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Conversation settings")
        self.setAccessibleName("Conversation settings")
        effective = overrides.apply(defaults)
        form = QFormLayout()

        self.temperature = QDoubleSpinBox(decimals=2, minimum=0.0, maximum=5.0, singleStep=0.05)
        self.temperature.setValue(effective.temperature)
        self.temperature.setSpecialValueText("0 (greedy)")
        self.own_temperature = self._row(form, "Temperature", self.temperature,
                                         overrides.temperature is not None,
                                         f"{defaults.temperature:g}")
        self.top_p = QDoubleSpinBox(decimals=2, minimum=0.01, maximum=1.0, singleStep=0.05)
        self.top_p.setValue(effective.top_p)
        self.own_top_p = self._row(form, "Top-p", self.top_p, overrides.top_p is not None,
                                   f"{defaults.top_p:g}")
        self.samplers = {}
        self.own_samplers = {}
        for field in SAMPLERS:
            editor = sampler_editor(field, getattr(effective, field.name))
            self.samplers[field.name] = editor
            default = getattr(defaults, field.name)
            self.own_samplers[field.name] = self._row(
                form, field.label, editor, getattr(overrides, field.name) is not None,
                field.off if field.off and default == field.low else f"{default:g}")
        self.max_tokens = QSpinBox(minimum=1, maximum=1 << 16, singleStep=128, suffix=" tokens")
        self.max_tokens.setValue(effective.max_tokens)
        self.own_max_tokens = self._row(form, "Longest reply", self.max_tokens,
                                        overrides.max_tokens is not None,
                                        f"{defaults.max_tokens} tokens")

        self.overflow = QComboBox()
        self.overflow.setAccessibleName("When the context is full")
        self.overflow.addItem(f"Default ({defaults.overflow.label.lower()})", None)
        for policy in Overflow:
            self.overflow.addItem(policy.label, policy)
        self.overflow.setToolTip(OVERFLOW_TIP)
        if overrides.overflow is not None:
            self.overflow.setCurrentIndex(self.overflow.findData(overrides.overflow))
        form.addRow("When the context is full", self.overflow)

        self.seed_mode = QComboBox()
        default_seed = ("a new one for every reply" if defaults.seed is None
                        else str(defaults.seed))
        self.seed_mode.addItems([f"Default ({default_seed})", "A new one for every reply",
                                 "Fixed"])
        self.seed_mode.setAccessibleName("Seed")
        self.seed = QSpinBox(minimum=0, maximum=0x7FFFFFFF)
        self.seed.setAccessibleName("Fixed seed")
        self.seed.setValue(overrides.seed if overrides.seed is not None else
                           defaults.seed or 0)
        self.seed_mode.setCurrentIndex(SEED_RANDOM if overrides.random_seed else
                                       SEED_FIXED if overrides.seed is not None else
                                       SEED_DEFAULT)
        self.seed_mode.currentIndexChanged.connect(self._seed_mode_changed)
        self._seed_mode_changed(self.seed_mode.currentIndex())
        seed_row = QHBoxLayout()
        seed_row.addWidget(self.seed_mode, 1)
        seed_row.addWidget(self.seed)
        form.addRow("Seed", seed_row)

        self.model = QComboBox()
        self.model.setAccessibleName("Model")
        self.model.addItem("Default: whatever model is loaded", None)
        for path in dict.fromkeys(p for p in (loaded_model, overrides.model) if p):
            self.model.addItem(Path(path).name, path)
            self.model.setItemData(self.model.count() - 1, path, Qt.ItemDataRole.ToolTipRole)
        if overrides.model:
            self.model.setCurrentIndex(self.model.findData(overrides.model))
        browse = QPushButton("Choose…")
        browse.setAccessibleName("Choose a model file")
        browse.clicked.connect(self._browse)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model, 1)
        model_row.addWidget(browse)
        form.addRow("Model", model_row)

        self.tools = tools
        self.tool_first = QCheckBox("Call a tool before answering each message")
        self.tool_first.setToolTip(
            "The model's reply to each of your messages starts with a call of one of the tools "
            "offered (small models often answer without calling otherwise); after a tool's "
            "result it answers freely.")
        self.tool_first.setChecked(overrides.tool_first)
        tools_box = None
        if tools is not None:
            tools_box = QGroupBox("Tools (from the MCP servers in Settings)")
            box_layout = QVBoxLayout(tools_box)
            box_layout.addWidget(tools)
            box_layout.addWidget(self.tool_first)

        note = QLabel("These apply to this conversation only, over the defaults in Settings. "
                      "A conversation with its own model offers to load it when you open it.")
        note.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel
                                   | QDialogButtonBox.StandardButton.RestoreDefaults)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        restore = buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults)
        restore.setText("Use the defaults")
        restore.clicked.connect(self._use_defaults)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        if tools_box is not None:
            layout.addWidget(tools_box)
        layout.addWidget(note)
        layout.addWidget(buttons)

    @staticmethod
    def _row(form: QFormLayout, label: str, editor: QWidget, own: bool,
             default: str) -> QCheckBox:
        """An editor with a box that says whether the value is this conversation's own."""
        box = QCheckBox(f"own (default {default})")
        box.setAccessibleName(f"{label}: this conversation's own value")
        box.setChecked(own)
        editor.setEnabled(own)
        editor.setAccessibleName(label)
        box.toggled.connect(editor.setEnabled)
        row = QHBoxLayout()
        row.addWidget(editor, 1)
        row.addWidget(box)
        form.addRow(label, row)
        return box

    def _seed_mode_changed(self, index: int) -> None:
        self.seed.setEnabled(index == SEED_FIXED)

    def _use_defaults(self) -> None:
        for box in (self.own_temperature, self.own_top_p, self.own_max_tokens,
                    *self.own_samplers.values()):
            box.setChecked(False)
        self.seed_mode.setCurrentIndex(SEED_DEFAULT)
        self.overflow.setCurrentIndex(0)
        self.model.setCurrentIndex(0)
        self.tool_first.setChecked(False)

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Model for this conversation", "",
                                              "GGUF models (*.gguf)")
        if path:
            self.choose_model(path)

    def choose_model(self, path: str) -> None:
        index = self.model.findData(path)
        if index < 0:
            self.model.addItem(Path(path).name, path)
            index = self.model.count() - 1
        self.model.setCurrentIndex(index)

    def chosen(self) -> Overrides:
        mode = self.seed_mode.currentIndex()
        model = self.model.currentData()
        return Overrides(
            temperature=self.temperature.value() if self.own_temperature.isChecked() else None,
            top_p=self.top_p.value() if self.own_top_p.isChecked() else None,
            **editor_values(self.samplers, {name: box.isChecked()
                                            for name, box in self.own_samplers.items()}),
            max_tokens=self.max_tokens.value() if self.own_max_tokens.isChecked() else None,
            seed=self.seed.value() if mode == SEED_FIXED else None,
            random_seed=mode == SEED_RANDOM,
            overflow=self.overflow.currentData(),
            model=model if isinstance(model, str) else None,
            tool_first=self.tool_first.isChecked(),
        )
