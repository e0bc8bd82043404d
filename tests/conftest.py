"""Shared fixtures: real llama.cpp on tiny generated models and on the bundled SmolLM2."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.bench.random_models import ModelKind, Quant, write_tiny_model
from engine.core.memory import MemoryKind
from engine.llm.runtime import Runtime, RuntimeSettings
from engine.models.files import default_model_path
from tests.fixtures import real_models

pytest_plugins = ["tests.app_fixtures"]

# Tests never touch the real home: every Arbor location goes under a temporary folder.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

ALL_KINDS = list(MemoryKind)


@pytest.fixture(autouse=True)
def _arbor_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "arbor-home"
    monkeypatch.setenv("ARBOR_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def _no_thread_left_running(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail any test that leaves a QThread running (napari's fixture, in spirit)."""
    from PySide6.QtCore import QThread

    started: list[QThread] = []
    original = QThread.start

    def start(self: QThread, *args: object) -> None:
        started.append(self)
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(QThread, "start", start)
    yield
    running = [t.objectName() or repr(t) for t in started if _alive(t) and t.isRunning()]
    assert not running, f"QThreads left running: {running}"


def _alive(thread: object) -> bool:
    import shiboken6

    return bool(shiboken6.isValid(thread))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma 3 270M Q4_K_M (a make test dependency): real K-quants, a real sliding window."""
    return real_models.gemma_path()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    """One tiny random-weight GGUF per memory kind, written once per test session."""
    out = tmp_path_factory.mktemp("models")
    return {
        kind.value: write_tiny_model(
            ModelKind(kind.value), out / f"tiny-{kind.value}.gguf", smollm2_path
        )
        for kind in ALL_KINDS
    }


QUANTS = list(Quant)


@pytest.fixture(scope="session")
def quantized_models(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path
) -> Callable[[MemoryKind, Quant], Path]:
    """A tiny model of a memory kind in a quantization, written on first use. Block
    quantizations come from the gguf package; Q4_K_M from llama.cpp's quantizer, 256 wide."""
    out = tmp_path_factory.mktemp("quantized")
    written: dict[tuple[MemoryKind, Quant], Path] = {}

    def get(kind: MemoryKind, quant: Quant) -> Path:
        if (kind, quant) not in written:
            written[kind, quant] = write_tiny_model(
                ModelKind(kind.value), out / f"tiny-{kind.value}-{quant.value}.gguf",
                smollm2_path, quant=quant, n_embd=256 if quant is Quant.Q4_K_M else 64,
            )
        return written[kind, quant]

    return get


RuntimeFactory = Callable[..., Runtime]


@pytest.fixture
def make_runtime() -> Iterator[RuntimeFactory]:
    """Open runtimes and close them all at the end of the test."""
    opened: list[Runtime] = []

    def factory(path: Path, **settings: object) -> Runtime:
        runtime = Runtime(path, RuntimeSettings(**settings))  # type: ignore[arg-type]
        opened.append(runtime)
        return runtime

    yield factory
    for runtime in opened:
        runtime.close()
