"""The user's settings: one JSON file in the config dir, validated, written atomically.

A setting is one of four kinds, by what applying it costs:
- context settings (context size, flash attention, K/V cache types) make a new llama.cpp
  context whose state layout differs, so the checkpoints saved so far cannot be loaded into
  it (they stay on disk under their own identity and serve again if the settings go back);
- load settings (GPU layers, threads) need the model loaded again but keep checkpoints;
- checkpoint settings (RAM budget, disk tier, interval) and sampling defaults apply at once.

Any file gives settings in range: a file Arbor cannot use (not a regular file, too large, not
strict JSON, a value of the wrong type or out of range) gives the defaults and one line saying
why, and is left as it is until the user saves settings.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

from engine.config.endpoints import RpcError, parse_endpoints
from engine.config.mcp import McpServer, server_problems
from engine.config.params import (
    GPU_LAYERS_FIT,
    KV_TYPE_NAMES,
    ContextParams,
    FlashAttention,
    RuntimeSettings,
    SamplingParams,
)
from engine.core.errors import ArborError, printable
from engine.core.overflow import Overflow
from engine.core.schedule import DEFAULT_INTERVAL
from engine.files.atomic import write_atomic
from engine.files.paths import data_dirs
from engine.files.regular import FormatError, read_regular
from engine.files.strict_json import loads_strict

log = logging.getLogger(__name__)

SETTINGS_FILE = "settings.json"
_VERSION = 1
MAX_SETTINGS_BYTES = 1 << 20  # a few hundred bytes, and a line per model with its own template
MAX_GPU_LAYERS = 999  # the dialog's largest: more than any model has
MAX_THREADS = 512
MAX_REPLY_TOKENS = 1 << 16
MAX_PATH_CHARS = 4096  # a model's path (PATH_MAX on Linux)
MAX_API_KEY_CHARS = 256
MAX_RPC_WORKERS = 16  # GGML_RPC_MAX_SERVERS

# A number out of range in the file sets the whole file aside (the defaults, and the reason
# shown once), except where a too-large number has a meaning that fits: it is clamped to that,
# the rest of the file is used, and the user is told once. Name: (largest, clamped to, meaning).
_CLAMPED: dict[str, tuple[int, int, str]] = {
    "n_gpu_layers": (MAX_GPU_LAYERS, -1, "GPU layers: more than any model has, so every layer"),
    "n_threads": (MAX_THREADS, 0, "threads: more than any machine has, so automatic"),
    "max_tokens": (MAX_REPLY_TOKENS, MAX_REPLY_TOKENS,
                   f"reply length: more than the longest, so {MAX_REPLY_TOKENS} tokens"),
}


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


_CONTEXT_FIELDS = ("n_ctx", "flash_attn", "type_k", "type_v", "rpc_workers")
_LOAD_FIELDS = ("n_gpu_layers", "n_threads")


@dataclass(frozen=True)
class Settings:
    n_ctx: int = 4096
    # GPU_LAYERS_FIT: as many as fit (llama.cpp's fit; none without a GPU); -1: every layer
    n_gpu_layers: int = GPU_LAYERS_FIT
    n_threads: int = 0  # 0: automatic (the physical cores less one)
    flash_attn: FlashAttention = FlashAttention.OFF
    type_k: str = "f16"
    type_v: str = "f16"
    checkpoint_ram_mib: int = 0  # 0: automatic (an eighth of RAM, 256 MiB to 4 GiB)
    disk_tier: bool = True
    checkpoint_interval: int = DEFAULT_INTERVAL
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40  # 0: off
    min_p: float = 0.05
    repeat_penalty: float = 1.0  # 1: off (engine.config.params.SamplingParams)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None  # None: a new seed for every reply
    max_tokens: int = 512
    overflow: Overflow = Overflow.STOP  # a branch longer than the context (engine.core.overflow)
    theme: Theme = Theme.SYSTEM
    model: str | None = None  # the model last loaded
    # The chat template chosen per model file (its path): a name from engine.core.templates.
    # A model missing here gets its own template, or llama.cpp's built-in one.
    templates: dict[str, str] = field(default_factory=dict)
    # The local OpenAI-compatible API (engine/api), served by the app while it runs, on
    # 127.0.0.1 only. The key (empty: none) is kept here in plain text, as peers do.
    api_server: bool = False
    api_port: int = 8080
    api_key: str = ""
    # llama.cpp RPC workers (host:port) that take the model's layers; see engine/llm/rpc.py.
    rpc_workers: tuple[str, ...] = ()
    # MCP servers whose tools conversations may offer the model (engine/config/mcp.py).
    mcp_servers: tuple[McpServer, ...] = ()

    def __post_init__(self) -> None:
        # Enums arrive as plain strings from JSON and from Qt's item data.
        try:
            object.__setattr__(self, "flash_attn", FlashAttention(self.flash_attn))
            object.__setattr__(self, "theme", Theme(self.theme))
            object.__setattr__(self, "overflow", Overflow(self.overflow))
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        problems = _problems(self)
        if problems:
            raise SettingsError("; ".join(problems))

    def runtime(self) -> RuntimeSettings:
        return RuntimeSettings(
            rpc_workers=tuple(self.rpc_workers),
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
        return replace(SamplingParams(), temperature=self.temperature, top_p=self.top_p,
                       top_k=self.top_k, min_p=self.min_p, repeat_penalty=self.repeat_penalty,
                       frequency_penalty=self.frequency_penalty,
                       presence_penalty=self.presence_penalty)

    def ram_budget(self) -> int | None:
        return self.checkpoint_ram_mib << 20 if self.checkpoint_ram_mib else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["rpc_workers"] = list(self.rpc_workers)  # as JSON holds it
        data["mcp_servers"] = [server.to_json() for server in self.mcp_servers]
        data["version"] = _VERSION
        return data

    @staticmethod
    def from_json(data: object) -> Settings:
        """Known keys with values of the right type; unknown keys are ignored (a newer
        version's file still opens), and a wrong value is a SettingsError."""
        return _from_json(data)[0]


def _from_json(data: object) -> tuple[Settings, list[str]]:
    """Settings.from_json, and what was clamped (see _CLAMPED) to tell the user."""
    if not isinstance(data, dict):
        raise SettingsError("the settings file does not hold a JSON object")
    values: dict[str, Any] = {}
    clamped: list[str] = []
    defaults = Settings()
    for f in fields(Settings):
        if f.name not in data:
            continue
        try:
            values[f.name] = _coerce(f.name, data[f.name], getattr(defaults, f.name))
        except (TypeError, ValueError) as exc:
            raise SettingsError(f"setting {f.name!r}: {exc}") from None
        if f.name in _CLAMPED and values[f.name] > _CLAMPED[f.name][0]:
            _, values[f.name], meaning = _CLAMPED[f.name]
            clamped.append(meaning)
    return Settings(**values), clamped


def _model_key(model: str | Path) -> str:
    return str(Path(model).expanduser().absolute())


def _coerce(name: str, value: object, default: object) -> object:
    if name in ("flash_attn", "theme", "overflow"):
        kind: type[StrEnum] = {"flash_attn": FlashAttention, "theme": Theme,
                               "overflow": Overflow}[name]
        names = [member.value for member in kind]
        if value not in names:
            raise ValueError(f"expected one of {', '.join(names)}, got {_shown(value)}")
        return kind(cast(str, value))
    if name == "rpc_workers":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TypeError("expected a list of host:port strings")
        return tuple(value)
    if name == "mcp_servers":
        if not isinstance(value, list):
            raise TypeError("expected a list of MCP servers")
        return tuple(McpServer.from_json(item) for item in value)
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
            raise TypeError(f"expected {expected.__name__} or null, got {_shown(value)}")
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {_shown(value)}")
        return value
    if isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"expected a whole number, got {_shown(value)}")
        return value
    if isinstance(default, float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeError(f"expected a number, got {_shown(value)}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {_shown(value)}")
        return value
    raise TypeError(f"unsupported value {_shown(value)}")


def _shown(value: object) -> str:
    return printable(repr(value) if isinstance(value, str) else value)


def _problems(s: Settings) -> list[str]:
    out: list[str] = []
    if not 256 <= s.n_ctx <= 1 << 20:
        out.append(f"context size must be between 256 and 1,048,576 tokens (got {s.n_ctx})")
    if not GPU_LAYERS_FIT <= s.n_gpu_layers <= MAX_GPU_LAYERS:
        out.append(f"GPU layers must be {GPU_LAYERS_FIT} (all that fit), -1 (all), 0 (none) "
                   f"or a number of layers up to {MAX_GPU_LAYERS}")
    if not 0 <= s.n_threads <= MAX_THREADS:
        out.append(f"threads must be 0 (automatic) or a number of threads up to {MAX_THREADS}")
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
    if not 0 <= s.top_k <= 1 << 20:
        out.append("top-k must be between 0 (off) and 1,048,576")
    if not 0.0 <= s.min_p <= 1.0:
        out.append("min-p must be between 0 and 1")
    if not 0.0 < s.repeat_penalty <= 10.0:
        out.append("the repetition penalty must be above 0 and at most 10 (1 is off)")
    for name in ("frequency_penalty", "presence_penalty"):
        if not -2.0 <= getattr(s, name) <= 2.0:
            out.append(f"the {name.replace('_', ' ')} must be between -2 and 2")
    if s.seed is not None and not 0 <= s.seed <= 0x7FFFFFFF:
        out.append("the seed must be between 0 and 2,147,483,647")
    if not 1 <= s.max_tokens <= MAX_REPLY_TOKENS:
        out.append("the reply length must be between 1 and 65,536 tokens")
    try:
        if len(s.rpc_workers) > MAX_RPC_WORKERS:
            out.append(f"at most {MAX_RPC_WORKERS} RPC workers")
        else:
            parse_endpoints(s.rpc_workers)
    except RpcError as exc:
        out.append(str(exc))
    if not 1 <= s.api_port <= 65535:
        out.append("the API server's port must be between 1 and 65,535")
    if len(s.api_key) > MAX_API_KEY_CHARS or not all(" " < c < "\x7f" for c in s.api_key):
        out.append(f"the API key must be at most {MAX_API_KEY_CHARS} printable ASCII "
                   f"characters without spaces")
    out.extend(server_problems(s.mcp_servers))
    for path in ([s.model] if s.model is not None else []) + list(s.templates):
        if len(path) > MAX_PATH_CHARS or "\0" in path:
            out.append(f"the model path {printable(path)} is longer than {MAX_PATH_CHARS} "
                       f"characters or holds a NUL")
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
    problem: str | None  # one line to show the user once: why the file was set aside or clamped


def load_settings(path: Path | None = None) -> Loaded:
    """The saved settings, or the defaults with the reason when the file is bad. Never
    raises: any file gives settings in range. A missing file is the defaults, quietly.

    A bad file is left where it is (the user may want to fix it by hand) until the user
    saves settings (an automatic save passes it by: see save_settings)."""
    loaded = _read(path or settings_path())
    if loaded.problem:
        log.warning("%s", loaded.problem)
    return loaded


def _read(path: Path) -> Loaded:
    try:
        path.stat()
    except FileNotFoundError:
        return Loaded(Settings(), None)
    except OSError:
        pass  # read_regular names the problem
    try:
        data = loads_strict(read_regular(path, MAX_SETTINGS_BYTES), max_bytes=MAX_SETTINGS_BYTES)
        settings, clamped = _from_json(data)
    except (FormatError, SettingsError) as exc:
        return Loaded(Settings(), f"{printable(path)} was not used ({printable(exc, 500)}); "
                                  f"using the defaults until you save settings")
    if clamped:
        return Loaded(settings, f"{printable(path)}: {'; '.join(clamped)}")
    return Loaded(settings, None)


def save_settings(settings: Settings, path: Path | None = None, *,
                  automatic: bool = False) -> bool:
    """Write atomically; a full disk raises SettingsError and leaves the old file.

    An `automatic` save (one the user did not ask for, such as remembering the model last
    loaded) leaves a file that was set aside or clamped as it is, and returns False."""
    path = path or settings_path()
    if automatic and _read(path).problem is not None:
        log.info("%s is left for the user to mend; the automatic save is skipped", path)
        return False
    data = json.dumps(settings.to_json(), indent=2, sort_keys=True).encode()
    try:
        write_atomic(path, data + b"\n")
    except OSError as exc:
        raise SettingsError(f"the settings could not be saved to {path}: {exc.strerror}") from exc
    return True
