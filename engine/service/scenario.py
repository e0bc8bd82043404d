"""Replay scenarios: a JSON description of a conversation's operations, validated up front.

```
{"model": "default" | "path/to/model.gguf", "n_ctx": 4096, "n_batch": 512, "seed": 42,
 "sampling": {"temperature": 0.0}, "system": "You are a helpful assistant.",
 "overflow": "stop" | "drop-oldest",
 "steps": [{"op": "send", "text": "...", "max_tokens": 32}, ...]}
```
Ops: send, regenerate, edit (message, text), switch (message, variant), rewind (message),
export (path), results (texts: the active reply's tool calls answered, then its answer).
`message` is a 0-based index on the active path, system prompt excluded. With `tools` (OpenAI's
function tools) at the top, the conversation offers them; `tool_choice` on send, regenerate or
edit ("required" or a tool's name) makes that reply call one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

from engine.config.params import SamplingParams
from engine.core.errors import ArborError, printable
from engine.core.overflow import Overflow
from engine.files.regular import FormatError, read_regular
from engine.files.strict_json import loads_strict

DEFAULT_MAX_TOKENS = 64
MAX_SCENARIO_BYTES = 16 << 20


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
    RESULTS = "results"  # the active reply's tool calls answered (texts), then answered


@dataclass(frozen=True)
class Step:
    index: int
    op: Op
    text: str | None = None
    message: int | None = None
    variant: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    path: str | None = None
    tool_choice: str | None = None
    texts: tuple[str, ...] = ()

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
    template: str | None = None  # a chat template by name (engine.core.templates); None: automatic
    overflow: Overflow = Overflow.STOP  # a branch longer than the context (engine.core.overflow)
    tools: tuple[dict[str, Any], ...] = ()  # offered to the model (OpenAI's function tools)
    steps: tuple[Step, ...] = ()
    base_dir: Path | None = None  # relative model paths are resolved against the file


_FIELDS: dict[Op, dict[str, type]] = {
    Op.SEND: {"text": str, "max_tokens": int, "tool_choice": str},
    Op.REGENERATE: {"message": int, "max_tokens": int,  # any reply; default: the last
                    "tool_choice": str},
    Op.EDIT: {"message": int, "text": str, "max_tokens": int, "tool_choice": str},
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
    Op.RESULTS: {"texts": list, "max_tokens": int},
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
    Op.RESULTS: {"texts"},
}
_TOP: dict[str, type | tuple[type, ...]] = {
    "model": str, "n_ctx": int, "n_batch": int, "seed": int, "sampling": dict,
    "system": str, "template": str, "overflow": str, "tools": list, "steps": list,
}
_SAMPLING: dict[str, type | tuple[type, ...]] = {
    "temperature": (int, float), "top_k": int, "top_p": (int, float), "min_p": (int, float),
}
# Every number's range, wherever it appears (no name means two things): what llama.cpp's C
# ints hold and the settings dialog offers, so nothing wraps on its way there.
_RANGES: dict[str, tuple[float, float]] = {
    "n_ctx": (16, 1 << 20), "n_batch": (1, 1 << 20), "seed": (0, 0x7FFFFFFF),
    "temperature": (0.0, 5.0), "top_k": (0, 1 << 20), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0),
    "message": (0, 1 << 20), "variant": (0, 1 << 20), "max_tokens": (1, 1 << 16),
}


def load_scenario(path: Path) -> Scenario:
    """The scenario in `path` (a regular file of at most MAX_SCENARIO_BYTES of strict JSON:
    no NaN, no duplicate keys, no deep nesting); ScenarioError for anything else."""
    try:
        data = loads_strict(read_regular(path, MAX_SCENARIO_BYTES), max_bytes=MAX_SCENARIO_BYTES)
    except FormatError as exc:
        raise ScenarioError(f"scenario {printable(path)}: {exc}") from None
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
    steps_raw = data["steps"]
    if not steps_raw:
        raise ScenarioError("scenario: `steps` is empty")
    steps = tuple(_parse_step(i, raw) for i, raw in enumerate(steps_raw))
    overflow = data.get("overflow", Overflow.STOP.value)
    if overflow not in set(Overflow):
        raise ScenarioError(f"scenario: `overflow` must be one of "
                            f"{', '.join(o.value for o in Overflow)}, not {printable(overflow)}")
    tools = data.get("tools", [])
    if not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
               and isinstance(t["function"].get("name"), str) for t in tools):
        raise ScenarioError("scenario: `tools` must be OpenAI's function tools, each with a "
                            "name")
    return Scenario(
        model=data.get("model", "default"),
        n_ctx=data.get("n_ctx", 4096),
        n_batch=data.get("n_batch", 512),
        seed=data.get("seed", 0),
        sampling=sampling,
        system=data.get("system", ""),
        template=data.get("template"),
        overflow=Overflow(overflow),
        tools=tuple(tools),
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
        raise ScenarioError(
            f"{where}: unknown op '{printable(op_name)}' (expected one of {known})"
        ) from None
    where = f"step {index} ({op.value})"
    allowed: dict[str, type | tuple[type, ...]] = {"op": str, **_FIELDS[op]}
    _check_keys(where, raw, allowed, required=_REQUIRED[op])
    return Step(
        index=index,
        op=op,
        text=raw.get("text"),
        message=raw.get("message"),
        variant=raw.get("variant"),
        max_tokens=raw.get("max_tokens", DEFAULT_MAX_TOKENS),
        path=raw.get("path"),
        tool_choice=raw.get("tool_choice"),
        texts=_texts(where, raw.get("texts", [])),
    )


def _texts(where: str, raw: list[Any]) -> tuple[str, ...]:
    if not all(isinstance(t, str) for t in raw):
        raise ScenarioError(f"{where}: `texts` must be a list of strings")
    return tuple(raw)


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
            raise ScenarioError(f"{where}: unknown field `{printable(key)}`")
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
        low, high = _RANGES.get(key, (0, 0))
        if key in _RANGES and not low <= value <= high:
            least = "0 or more" if low == 0 else f"at least {low}"
            raise ScenarioError(
                f"{where}: `{key}` must be {least} and at most {high}, not {printable(value)}"
            )


def _json_name(py_name: str) -> str:
    return {
        "str": "a string", "int": "an integer", "dict": "an object", "list": "a list",
    }.get(py_name, "a number")

