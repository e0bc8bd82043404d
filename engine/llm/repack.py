"""Weight repacking: on, unless it is known or found to crash the engine on this CPU.

llama.cpp repacks quantized weights at load into the layouts its fastest CPU kernels read
(its "extra buffer types": interleaved AVX2/AVX-512 blocks, AMX tiles). Some of those kernels
crash on some CPUs: the AMX ones of the vendored llama.cpp end the process on any batch of two
or more tokens on Sapphire Rapids (ggml-org/llama.cpp #20824). Python cannot catch that, so
Arbor finds out the way a careful person would:

- What is known up front is avoided up front (engine.llm.backends: an AMX CPU never gets the AMX
  CPU library; a build with AMX linked in loads with repacking off).
- For the rest, the engine process that loads a model decodes a canary batch before it says
  the model is loaded (engine.llm.runtime), and until its first real prompt is decoded it keeps a
  marker file naming (model file, llama.cpp build, CPU).
- If the process dies of a fault (SIGSEGV, SIGILL, SIGBUS, SIGFPE) while its marker is there,
  its parent (`note_exit`, called by engine.service.process for every front end) records that this
  combination needs repacking off. The next load reads the record, loads without repacking,
  and tells the user once. Killed (SIGKILL) or aborted (llama.cpp's asserts, a lost RPC
  worker) is no kernel fault and changes nothing; a second crash without repacking is an
  ordinary crash (the front ends stop after a few), so nothing loops.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.files.atomic import write_atomic
from engine.files.paths import DataDirs, data_dirs
from engine.llm.backends import Backends, library_dir
from engine.llm.cpu import cpu_flags, cpu_name

log = logging.getLogger(__name__)

# What turning repacking off cost, measured with `arbor-engine kernels --rounds 5` on
# SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M (2 cores, AVX-512, the zen4 library): prompts
# 0-13% faster without it, generation within 10% (docs/guide.md, "What repacking off
# costs"). Not measured on an AMX CPU, where the kernels that crash are the fast ones.
REPACK_OFF_COST = "measured on an AVX-512 CPU: as fast, within 10%"
CRASHED = "llama.cpp's optimized kernels crashed on this CPU; running without them"
CRASHED_NOW = "llama.cpp's optimized kernels crashed on this CPU; it runs without them from now on"
KNOWN_BAD = "llama.cpp's AMX kernels crash on this CPU; running without weight repacking"
# Fatal signals that mean the kernels faulted, as an exit code (negative) or Windows status.
_FAULTS = frozenset({-signal.SIGSEGV, -signal.SIGILL, -signal.SIGBUS, -signal.SIGFPE,
                     0xC0000005, 0xC000001D})  # access violation, illegal instruction


def _folder(dirs: DataDirs | None) -> Path:
    return (dirs or data_dirs()).cache / "kernels"


def _records_path(dirs: DataDirs | None) -> Path:
    return _folder(dirs) / "faults.json"


def _read_records(dirs: DataDirs | None) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(_records_path(dirs).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}  # none yet, or unreadable: nothing is known to crash
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, dict)}


def _write_records(records: dict[str, dict[str, Any]], dirs: DataDirs | None) -> None:
    path = _records_path(dirs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(records, indent=1, sort_keys=True).encode())
    except OSError as exc:
        log.warning("could not write %s: %s", path, exc)


def _file_stamp(path: Path) -> list[object]:
    try:
        st = path.stat()
    except OSError:
        return [path.name, None]
    return [path.name, st.st_size, st.st_mtime_ns]


def combination_key(model: Path, backends: Backends) -> tuple[str, dict[str, str]]:
    """A stable name for (model file, llama.cpp build, CPU), and those three in words."""
    folder = library_dir()
    try:
        version = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        version = "?"
    libraries = sorted(folder.glob("*ggml*")) + sorted(folder.glob("*llama*"))
    parts = {
        "model": str(model.resolve()),
        "build": f"llama-cpp-python {version}, {backends.cpu_variant} CPU library, {folder}",
        "cpu": cpu_name() or "unknown CPU",
    }
    text = json.dumps({
        "model": [*_file_stamp(model.resolve()), parts["model"]],
        "build": [parts["build"], *(_file_stamp(p) for p in libraries)],
        "cpu": [parts["cpu"], sorted(cpu_flags())],
    }, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32], parts


@dataclass(frozen=True)
class Decision:
    repack: bool
    notice: str | None = None  # what to tell the user now (once per combination)


class RepackGuard:
    """The engine side: decides before a load, and marks the window in which a crash means
    the kernels. One per model load."""

    def __init__(self, model: Path, backends: Backends, dirs: DataDirs | None = None) -> None:
        self.backends = backends
        self.dirs = dirs
        self.key, self.parts = combination_key(model, backends)
        self._marker: Path | None = None

    def decide(self) -> Decision:
        """Off where known or recorded to crash, with the notice only the first time (the
        record remembers it was told)."""
        records = _read_records(self.dirs)
        record = records.get(self.key)
        if record is not None:
            words = CRASHED
        elif self.backends.repack_known_bad:
            words, record = KNOWN_BAD, {**self.parts, "why": "known", "when": _now()}
        else:
            return Decision(True)
        if record.get("told"):
            return Decision(False)
        records[self.key] = {**record, "told": True}
        _write_records(records, self.dirs)
        return Decision(False, f"{words} ({REPACK_OFF_COST})")

    def arm(self) -> None:
        """From here until `disarm`, a fault of this process means these kernels."""
        folder = _folder(self.dirs)
        _forget_dead_markers(folder)
        marker = folder / f"pending-{os.getpid()}-{self.key}.json"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(marker, json.dumps({"key": self.key, **self.parts}).encode())
        except OSError as exc:  # a read-only cache: the canary still runs, unrecorded
            log.warning("could not write %s: %s", marker, exc)
            return
        self._marker = marker

    def disarm(self) -> None:
        marker, self._marker = self._marker, None
        if marker is not None:
            with contextlib.suppress(OSError):
                marker.unlink()

    @property
    def armed(self) -> bool:
        return self._marker is not None


def note_exit(pid: int | None, exitcode: int | None, dirs: DataDirs | None = None
              ) -> str | None:
    """After engine process `pid` ended: if it died of a fault while loading a model or
    decoding that model's first prompt, record that the combination needs repacking off and
    return what to tell the user. Its markers are removed either way."""
    if pid is None:
        return None
    fallback: str | None = None
    for marker in _folder(dirs).glob(f"pending-{pid}-*.json"):
        try:
            pending = json.loads(marker.read_text(encoding="utf-8"))
            marker.unlink()
        except (OSError, ValueError, RecursionError):
            continue
        if exitcode not in _FAULTS or not isinstance(pending, dict) \
                or not isinstance(pending.get("key"), str):
            continue
        records = _read_records(dirs)
        records[pending["key"]] = {
            **{k: str(v) for k, v in pending.items() if k != "key"},
            "why": "crashed", "when": _now(), "exitcode": exitcode, "told": False}
        _write_records(records, dirs)
        log.warning("the engine faulted while loading %s; it loads without weight repacking "
                    "from now on", pending.get("model"))
        fallback = CRASHED_NOW
    return fallback


def _forget_dead_markers(folder: Path) -> None:
    """Markers of processes that ended without a parent noting it (an engine in the window's
    own process, a command line's in-process engine): the cause is unknown, so they say
    nothing."""
    if sys.platform == "win32":
        return  # os.kill there ends the process it names
    for marker in folder.glob("pending-*.json"):
        try:
            pid = int(marker.name.split("-")[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                marker.unlink()
        except (ValueError, IndexError, OSError):
            continue


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
