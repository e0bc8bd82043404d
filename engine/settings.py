"""The user's settings: one JSON file in the config dir, validated, written atomically.

A setting is one of four kinds, by what applying it costs:
- context settings (context size, flash attention, K/V cache types) make a new llama.cpp
  context whose state layout differs, so the checkpoints saved so far cannot be loaded into
  it (they stay on disk under their own identity and serve again if the settings go back);
- load settings (GPU layers, threads) need the model loaded again but keep checkpoints;
- checkpoint settings (RAM budget, disk tier, interval) and sampling defaults apply at once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

from engine.atomic import write_atomic
from engine.checkpoints import DEFAULT_INTERVAL
from engine.errors import ArborError
from engine.params import (
    KV_TYPE_NAMES,
    ContextParams,
    FlashAttention,
    RuntimeSettings,
    SamplingParams,
)
from engine.paths import data_dirs

log = logging.getLogger(__name__)

SETTINGS_FILE = "settings.json"
_VERSION = 1


class SettingsError(ArborError):
    """A value out of range, or a settings file Arbor cannot read."""


class Theme(StrEnum):
    SYSTEM = "system"
    LIGHT = "light"
    DARK = "dark"


class Effect(StrEnum):
    """What applying a change takes, from the cheapest."""

    NONE = "none"
    LIVE = "live"  # applied at once
    RELOAD = "reload"  # the model is loaded again; checkpoints stay valid
    INVALIDATE = "invalidate"  # the model is loaded again; saved checkpoints no longer fit


_CONTEXT_FIELDS = ("n_ctx", "flash_attn", "type_k", "type_v")
_LOAD_FIELDS = ("n_gpu_layers", "n_threads")


@dataclass(frozen=True)
class Settings:
    n_ctx: int = 4096
    n_gpu_layers: int = 0  # -1: every layer
    n_threads: int = 0  # 0: all cores
    flash_attn: FlashAttention = FlashAttention.OFF
    type_k: str = "f16"
    type_v: str = "f16"
    checkpoint_ram_mib: int = 0  # 0: automatic (an eighth of RAM, 256 MiB to 4 GiB)
    disk_tier: bool = True
    checkpoint_interval: int = DEFAULT_INTERVAL
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int | None = None  # None: a new seed for every reply
    max_tokens: int = 512
    theme: Theme = Theme.SYSTEM
    model: str | None = None  # the model last loaded
    # The chat template chosen per model file (its path): a name from engine.templates.
    # A model missing here gets its own template, or llama.cpp's built-in one.
    templates: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Enums arrive as plain strings from JSON and from Qt's item data.
        try:
            object.__setattr__(self, "flash_attn", FlashAttention(self.flash_attn))
            object.__setattr__(self, "theme", Theme(self.theme))
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        problems = _problems(self)
        if problems:
            raise SettingsError("; ".join(problems))

    def runtime(self) -> RuntimeSettings:
        return RuntimeSettings(
            n_ctx=self.n_ctx,
            n_threads=self.n_threads,
            n_gpu_layers=self.n_gpu_layers,
            context=ContextParams(
                flash_attn=self.flash_attn, type_k=self.type_k, type_v=self.type_v
            ),
        )

    def template_for(self, model: str | Path) -> str | None:
        """The chat template chosen for a model file; None: automatic."""
        return self.templates.get(_model_key(model))

    def with_template(self, model: str | Path, name: str | None) -> Settings:
        """These settings with `name` chosen for `model` (None: back to automatic)."""
        templates = dict(self.templates)
        templates.pop(_model_key(model), None)
        if name is not None:
            templates[_model_key(model)] = name
        return replace(self, templates=templates)

    def sampling(self) -> SamplingParams:
        return replace(SamplingParams(), temperature=self.temperature, top_p=self.top_p)

    def ram_budget(self) -> int | None:
        return self.checkpoint_ram_mib << 20 if self.checkpoint_ram_mib else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = _VERSION
        return data

    @staticmethod
    def from_json(data: object) -> Settings:
        """Known keys with values of the right type; unknown keys are ignored (a newer
        version's file still opens), and a wrong value is a SettingsError."""
        if not isinstance(data, dict):
            raise SettingsError("the settings file does not hold a JSON object")
        values: dict[str, Any] = {}
        defaults = Settings()
        for f in fields(Settings):
            if f.name not in data:
                continue
            value = data[f.name]
            default = getattr(defaults, f.name)
            try:
                values[f.name] = _coerce(f.name, value, default)
            except (TypeError, ValueError) as exc:
                raise SettingsError(f"setting {f.name!r}: {exc}") from None
        return Settings(**values)


def _model_key(model: str | Path) -> str:
    return str(Path(model).expanduser().absolute())


def _coerce(name: str, value: object, default: object) -> object:
    if name == "flash_attn":
        return FlashAttention(cast(str, value))  # any other value is a ValueError
    if name == "theme":
        return Theme(cast(str, value))
    if name == "templates":
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise TypeError("expected an object of model paths to template names")
        return dict(value)
    if name in ("seed", "model"):
        if value is None:
            return None
        expected: type = int if name == "seed" else str
        if not isinstance(value, expected) or isinstance(value, bool):
            raise TypeError(f"expected {expected.__name__} or null, got {value!r}")
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"expected a whole number, got {value!r}")
        return value
    if isinstance(default, float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported value {value!r}")


def _problems(s: Settings) -> list[str]:
    out: list[str] = []
    if not 256 <= s.n_ctx <= 1 << 20:
        out.append(f"context size must be between 256 and 1,048,576 tokens (got {s.n_ctx})")
    if s.n_gpu_layers < -1:
        out.append("GPU layers must be -1 (all), 0 (none) or a number of layers")
    if not 0 <= s.n_threads <= 512:
        out.append("threads must be 0 (all cores) or a number of threads up to 512")
    for name in ("type_k", "type_v"):
        if getattr(s, name) not in KV_TYPE_NAMES:
            out.append(f"{name}: unknown cache type {getattr(s, name)!r} "
                       f"(one of {', '.join(sorted(KV_TYPE_NAMES))})")
    if s.type_v != "f16" and s.type_v != "f32" and s.flash_attn is FlashAttention.OFF:
        out.append("a quantized V cache needs flash attention (on or auto)")
    if s.checkpoint_ram_mib != 0 and not 16 <= s.checkpoint_ram_mib <= 1 << 20:
        out.append("the checkpoint RAM budget must be 0 (automatic) or at least 16 MiB")
    if not 64 <= s.checkpoint_interval <= 1 << 20:
        out.append("the checkpoint interval must be at least 64 tokens")
    if not 0.0 <= s.temperature <= 5.0:
        out.append("temperature must be between 0 and 5")
    if not 0.0 < s.top_p <= 1.0:
        out.append("top-p must be above 0 and at most 1")
    if s.seed is not None and not 0 <= s.seed <= 0x7FFFFFFF:
        out.append("the seed must be between 0 and 2,147,483,647")
    if not 1 <= s.max_tokens <= 1 << 16:
        out.append("the reply length must be between 1 and 65,536 tokens")
    return out


def effect_of(old: Settings, new: Settings) -> Effect:
    """The most expensive consequence of going from `old` to `new`."""
    changed = {f.name for f in fields(Settings) if getattr(old, f.name) != getattr(new, f.name)}
    if changed & set(_CONTEXT_FIELDS):
        return Effect.INVALIDATE
    if changed & set(_LOAD_FIELDS):
        return Effect.RELOAD
    return Effect.LIVE if changed else Effect.NONE


def settings_path() -> Path:
    return data_dirs().config / SETTINGS_FILE


@dataclass(frozen=True)
class Loaded:
    settings: Settings
    problem: str | None  # why the file was not used, to show the user once


def load_settings(path: Path | None = None) -> Loaded:
    """The saved settings, or the defaults with the reason when the file is missing or bad.

    A bad file is left where it is (the user may want to fix it by hand) until the next save
    replaces it.
    """
    path = path or settings_path()
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Loaded(Settings(), None)
    except OSError as exc:
        return Loaded(Settings(), f"{path} could not be read ({exc.strerror}); using defaults")
    try:
        return Loaded(Settings.from_json(json.loads(raw)), None)
    except json.JSONDecodeError as exc:
        problem = f"{path} is not valid JSON (line {exc.lineno}); using defaults"
    except SettingsError as exc:
        problem = f"{path}: {exc}; using defaults"
    log.warning("%s", problem)
    return Loaded(Settings(), problem)


def save_settings(settings: Settings, path: Path | None = None) -> None:
    """Write atomically; a full disk raises SettingsError and leaves the old file."""
    path = path or settings_path()
    data = json.dumps(settings.to_json(), indent=2, sort_keys=True).encode()
    try:
        write_atomic(path, data + b"\n")
    except OSError as exc:
        raise SettingsError(f"the settings could not be saved to {path}: {exc.strerror}") from exc
