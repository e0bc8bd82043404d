"""The samplers beyond temperature and top-p (engine.config.params.SamplingParams), as the
Settings dialog and a conversation's own settings both edit them: one spec, one editor each."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox


@dataclass(frozen=True)
class SamplerField:
    name: str  # the Settings (and Overrides) field
    label: str
    low: float
    high: float
    step: float
    decimals: int  # 0: a whole number
    tip: str
    off: str = ""  # shown at `low` when that value turns the sampler off


SAMPLERS = (
    SamplerField("top_k", "Top-k", 0, 1000, 5, 0,
                 "Draw only from this many of the likeliest tokens.", off="0 (off)"),
    SamplerField("min_p", "Min-p", 0.0, 1.0, 0.01, 2,
                 "Leave out tokens less likely than this share of the likeliest one's "
                 "probability.", off="0 (off)"),
    SamplerField("repeat_penalty", "Repetition penalty", 1.0, 10.0, 0.05, 2,
                 "Make tokens among the latest 64 (the conversation's included) less likely: "
                 "their logits are divided by this.", off="1 (off)"),
    SamplerField("frequency_penalty", "Frequency penalty", -2.0, 2.0, 0.1, 2,
                 "Lower a token by this for each time it came in the latest 64 tokens."),
    SamplerField("presence_penalty", "Presence penalty", -2.0, 2.0, 0.1, 2,
                 "Lower a token by this once it came in the latest 64 tokens."),
)


def sampler_editor(field: SamplerField, value: float) -> QSpinBox | QDoubleSpinBox:
    editor: QSpinBox | QDoubleSpinBox
    if field.decimals == 0:
        editor = QSpinBox(minimum=int(field.low), maximum=int(field.high),
                          singleStep=int(field.step))
        editor.setValue(int(value))
    else:
        editor = QDoubleSpinBox(decimals=field.decimals, minimum=field.low, maximum=field.high,
                                singleStep=field.step)
        editor.setValue(float(value))
    if field.off:
        editor.setSpecialValueText(field.off)
    editor.setToolTip(field.tip)
    editor.setAccessibleName(field.label)
    editor.setAlignment(Qt.AlignmentFlag.AlignRight)
    return editor


def editor_value(field: SamplerField, editor: QSpinBox | QDoubleSpinBox) -> int | float:
    return int(editor.value()) if field.decimals == 0 else float(editor.value())


def editor_values(editors: Mapping[str, QSpinBox | QDoubleSpinBox],
                  chosen: Mapping[str, bool] | None = None) -> dict[str, Any]:
    """The edited values by field name (only the `chosen` ones, when given)."""
    return {f.name: editor_value(f, editors[f.name]) for f in SAMPLERS
            if chosen is None or chosen[f.name]}
