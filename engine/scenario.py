"""Replay scenarios: a JSON description of a conversation's operations, validated up front.

```
{"model": "default" | "path/to/model.gguf", "n_ctx": 4096, "n_batch": 512, "seed": 42,
 "sampling": {"temperature": 0.0}, "system": "You are a helpful assistant.",
 "steps": [{"op": "send", "text": "...", "max_tokens": 32}, ...]}
```
Ops: send, regenerate, edit (message, text), switch (message, variant), rewind (message),
export (path). `message` is a 0-based index on the active path, system prompt excluded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

from engine.errors import ArborError
from engine.params import SamplingParams

DEFAULT_MAX_TOKENS = 64


class ScenarioError(ArborError):
    """The scenario file is invalid; the message names the step and the problem."""


class Op(StrEnum):
    SEND = "send"
    REGENERATE = "regenerate"
    EDIT = "edit"
    SWITCH = "switch"
    REWIND = "rewind"
    WARM = "warm"  # prepare the active branch, as the app does while the user reads
    EXPORT = "export"
    CONTINUE = "continue"  # more of the active leaf's reply (or a reply to its user message)
    DELETE = "delete"  # a message and its branch
    UNDO = "undo"  # the last delete
    FORK = "fork"  # a new conversation holding the path up to a message; later steps act on it
    SYSTEM = "system"  # the conversation's system prompt
    ACTIVATE = "activate"  # a version's branch, as a click in the tree panel does


@dataclass(frozen=True)
class Step:
    index: int
    op: Op
    text: str | None = None
    message: int | None = None
    variant: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    path: str | None = None

    def describe(self) -> str:
        return f"step {self.index} ({self.op.value})"


@dataclass(frozen=True)
class Scenario:
    model: str = "default"
    n_ctx: int = 4096
    n_batch: int = 512
    seed: int = 0
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    system: str = ""
    template: str | None = None  # a chat template by name (engine.templates); None: automatic
    steps: tuple[Step, ...] = ()
    base_dir: Path | None = None  # relative model paths are resolved against the file


_FIELDS: dict[Op, dict[str, type]] = {
    Op.SEND: {"text": str, "max_tokens": int},
    Op.REGENERATE: {"message": int, "max_tokens": int},  # any reply; default: the last
    Op.EDIT: {"message": int, "text": str, "max_tokens": int},
    Op.SWITCH: {"message": int, "variant": int},
    Op.REWIND: {"message": int},
    Op.WARM: {},
    Op.EXPORT: {"path": str},
    Op.CONTINUE: {"max_tokens": int},
    Op.DELETE: {"message": int},
    Op.UNDO: {},
    Op.FORK: {"message": int},
    Op.SYSTEM: {"text": str},
    Op.ACTIVATE: {"message": int, "variant": int},
}
_REQUIRED: dict[Op, set[str]] = {
    Op.SEND: {"text"},
    Op.REGENERATE: set(),
    Op.EDIT: {"message", "text"},
    Op.SWITCH: {"message", "variant"},
    Op.REWIND: {"message"},
    Op.WARM: set(),
    Op.EXPORT: {"path"},
    Op.CONTINUE: set(),
    Op.DELETE: {"message"},
    Op.UNDO: set(),
    Op.FORK: {"message"},
    Op.SYSTEM: {"text"},
    Op.ACTIVATE: {"message", "variant"},
}
_TOP: dict[str, type | tuple[type, ...]] = {
    "model": str, "n_ctx": int, "n_batch": int, "seed": int, "sampling": dict,
    "system": str, "template": str, "steps": list,
}
_SAMPLING: dict[str, type | tuple[type, ...]] = {
    "temperature": (int, float), "top_k": int, "top_p": (int, float), "min_p": (int, float),
}


def load_scenario(path: Path) -> Scenario:
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise ScenarioError(f"scenario {path.name} is not valid JSON: {exc}") from exc
    return parse_scenario(data, base_dir=path.parent)


def parse_scenario(data: Any, *, base_dir: Path | None = None) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError("scenario: the top level must be a JSON object")
    _check_keys("scenario", data, _TOP, required={"steps"})
    sampling_raw = data.get("sampling", {})
    _check_keys("scenario sampling", sampling_raw, _SAMPLING, required=set())
    defaults = SamplingParams(temperature=0.0)
    sampling = SamplingParams(
        temperature=float(sampling_raw.get("temperature", defaults.temperature)),
        top_k=int(sampling_raw.get("top_k", defaults.top_k)),
        top_p=float(sampling_raw.get("top_p", defaults.top_p)),
        min_p=float(sampling_raw.get("min_p", defaults.min_p)),
    )
    n_ctx = data.get("n_ctx", 4096)
    n_batch = data.get("n_batch", 512)
    if n_ctx < 16:
        raise ScenarioError(f"scenario: n_ctx must be at least 16, not {n_ctx}")
    if n_batch < 1:
        raise ScenarioError(f"scenario: n_batch must be positive, not {n_batch}")
    steps_raw = data["steps"]
    if not steps_raw:
        raise ScenarioError("scenario: `steps` is empty")
    steps = tuple(_parse_step(i, raw) for i, raw in enumerate(steps_raw))
    return Scenario(
        model=data.get("model", "default"),
        n_ctx=n_ctx,
        n_batch=n_batch,
        seed=data.get("seed", 0),
        sampling=sampling,
        system=data.get("system", ""),
        template=data.get("template"),
        steps=steps,
        base_dir=base_dir,
    )


def _parse_step(index: int, raw: Any) -> Step:
    where = f"step {index}"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: a step must be a JSON object")
    op_name = raw.get("op")
    try:
        op = Op(cast(str, op_name))
    except ValueError:
        known = ", ".join(o.value for o in Op)
        raise ScenarioError(f"{where}: unknown op {op_name!r} (expected one of {known})") from None
    where = f"step {index} ({op.value})"
    allowed: dict[str, type | tuple[type, ...]] = {"op": str, **_FIELDS[op]}
    _check_keys(where, raw, allowed, required=_REQUIRED[op])
    for name in ("message", "variant"):
        if name in raw and raw[name] < 0:
            raise ScenarioError(f"{where}: `{name}` must be 0 or more, not {raw[name]}")
    max_tokens = raw.get("max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens < 1:
        raise ScenarioError(f"{where}: `max_tokens` must be at least 1, not {max_tokens}")
    return Step(
        index=index,
        op=op,
        text=raw.get("text"),
        message=raw.get("message"),
        variant=raw.get("variant"),
        max_tokens=max_tokens,
        path=raw.get("path"),
    )


def _check_keys(
    where: str,
    obj: Any,
    allowed: dict[str, type | tuple[type, ...]],
    *,
    required: set[str],
) -> None:
    if not isinstance(obj, dict):
        raise ScenarioError(f"{where}: must be a JSON object")
    for key in obj:
        if key not in allowed:
            raise ScenarioError(f"{where}: unknown field `{key}`")
    for key in sorted(required):
        if key not in obj:
            raise ScenarioError(f"{where}: missing field `{key}`")
    for key, value in obj.items():
        expected = allowed[key]
        ok = isinstance(value, expected) and not isinstance(value, bool)
        if isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            names = expected.__name__ if isinstance(expected, type) else "number"
            raise ScenarioError(f"{where}: `{key}` must be {_json_name(names)}")


def _json_name(py_name: str) -> str:
    return {
        "str": "a string", "int": "an integer", "dict": "an object", "list": "a list",
    }.get(py_name, "a number")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")
