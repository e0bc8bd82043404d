"""A conversation's own settings over the defaults: its sampling, reply length, what happens
when it outgrows the context, and its model.

They live in the conversation's `settings` JSON (under OVERRIDES), so they are saved with it,
exported and imported with it, and survive a restart. Read leniently: a value that is not a
valid setting (a hand-edited or foreign file) is dropped, never fatal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from engine.config.settings import Settings, SettingsError
from engine.core.overflow import Overflow

OVERRIDES = "overrides"
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                   "frequency_penalty", "presence_penalty", "seed", "max_tokens")
_INT_FIELDS = ("top_k", "seed", "max_tokens")


@dataclass(frozen=True)
class Overrides:
    """None: the default. A seed of None is the default too (which may be a fixed seed or a
    new one per reply); `random_seed` asks for a new seed per reply over a fixed default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    random_seed: bool = False
    max_tokens: int | None = None
    overflow: Overflow | None = None  # when the branch outgrows the context
    model: str | None = None  # a model file's path: offered when the conversation opens
    # With tools offered: each reply to a message calls one first (tool_choice "required").
    tool_first: bool = False

    @classmethod
    def read(cls, settings: Mapping[str, Any]) -> Overrides:
        """The overrides in a conversation's settings; invalid values are left out."""
        raw = settings.get(OVERRIDES)
        if not isinstance(raw, Mapping):
            return cls()
        kept: dict[str, Any] = {}
        for name in SAMPLING_FIELDS:
            value = raw.get(name)
            if value is None or isinstance(value, bool):
                continue
            try:
                replace(Settings(), **{name: value})  # Settings' own checks: ranges, types
            except (SettingsError, TypeError):
                continue
            if name in _INT_FIELDS and not isinstance(value, int):
                continue
            if name not in _INT_FIELDS and not isinstance(value, int | float):
                continue
            kept[name] = value if name in _INT_FIELDS else float(value)
        if raw.get("random_seed") is True:
            kept["random_seed"] = True
            kept.pop("seed", None)
        overflow = raw.get("overflow")
        if isinstance(overflow, str) and overflow in set(Overflow):
            kept["overflow"] = Overflow(overflow)
        model = raw.get("model")
        if isinstance(model, str) and model.strip():
            kept["model"] = model
        if raw.get("tool_first") is True:
            kept["tool_first"] = True
        return cls(**kept)

    def write(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """`settings` with these overrides in place (and none stored when all are default)."""
        out = {k: v for k, v in settings.items() if k != OVERRIDES}
        # `is`, not `in`: 0.0 and 0 (greedy, seed 0) equal False and must be kept.
        mine = {k: v for k, v in asdict(self).items() if v is not None and v is not False}
        if mine:
            out[OVERRIDES] = mine
        return out

    @property
    def is_default(self) -> bool:
        return self == Overrides()

    def apply(self, defaults: Settings) -> Settings:
        """The settings a reply in this conversation uses."""
        changes: dict[str, Any] = {name: getattr(self, name)
                                   for name in (*SAMPLING_FIELDS, "overflow")
                                   if getattr(self, name) is not None}
        if self.random_seed:
            changes["seed"] = None
        return replace(defaults, **changes)

    def describe(self) -> str:
        """In words, for the status bar: 'temperature 0.2, seed 7' (empty when default)."""
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "random_seed":
                if value:
                    parts.append("a new seed per reply")
            elif f.name == "tool_first":
                if value:
                    parts.append("a tool call before each answer")
            elif f.name == "model" and value:
                parts.append(f"model {value.rsplit('/', 1)[-1]}")
            elif f.name == "overflow" and value is not None:
                parts.append("oldest messages left out when full"
                             if value is Overflow.DROP_OLDEST else "stop when full")
            elif value is not None:
                parts.append(f"{f.name.replace('_', ' ')} {value:g}" if isinstance(value, float)
                             else f"{f.name.replace('_', ' ')} {value}")
        return ", ".join(parts)
