"""Shared fixtures, and the markers every test gets from what it needs.

This module imports neither llama.cpp nor the window: a test that needs neither pays for
neither. The fixtures that load a model import the runtime when they run; the window's
fixtures live in tests/app_fixtures.py and import the window the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from engine.core.memory import MemoryKind
from engine.models.files import default_model_path
from tests.fixtures import real_models

if TYPE_CHECKING:
    from engine.bench.random_models import Quant
    from engine.llm.runtime import Runtime

pytest_plugins = ["tests.app_fixtures"]

# Tests never touch the real home: every Arbor location goes under a temporary folder.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

ALL_KINDS = list(MemoryKind)

# --- markers: what a test needs, decided from the fixtures it uses ---------------------------

# A test is marked with each marker whose fixtures its fixture closure (the fixtures it asks
# for, and the ones those ask for) reaches. A test that needs one of these without going
# through a fixture (it spawns an engine process itself, say) carries the marker on its module
# (`pytestmark`); `_engine_processes_are_marked` below fails one that forgets.
MARKER_FIXTURES: dict[str, frozenset[str]] = {
    # Loads a GGUF into llama.cpp (or writes one with it).
    "model": frozenset({"smollm2_path", "gemma_path", "tiny_models", "tool_models",
                        "quantized_models",
                        "make_runtime", "engine_calls"}),
    # A Qt application with widgets: anything through pytest-qt.
    "window": frozenset({"qtbot", "qapp", "qtmodeltester"}),
    # Starts an engine process (the window's default engine is one, model or not).
    "engine_process": frozenset({"window", "smol_window"}),
    # Minutes rather than seconds: the real models' windows and quantized writers.
    "slow": frozenset({"gemma_path", "smol_window", "quantized_models"}),
}
# The markers `make test-fast` leaves out: what is left is plain Python (no model, no Qt
# application, no child engine process waiting on its timeouts) and runs in under a minute.
FAST_EXCLUDES = ("model", "window", "engine_process", "slow")


def markers_for(fixturenames: Iterable[str], existing: set[str]) -> set[str]:
    """The markers a test with these fixtures gets, besides those it has (`existing`)."""
    names = set(fixturenames)
    wanted = {marker for marker, fixtures in MARKER_FIXTURES.items() if names & fixtures}
    return wanted - existing


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        existing = {mark.name for mark in item.iter_markers()}
        for name in sorted(markers_for(getattr(item, "fixturenames", ()), existing)):
            item.add_marker(name)


@pytest.fixture(autouse=True)
def _engine_processes_are_marked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail a test that starts a child process of `multiprocessing` (an engine process, an RPC
    worker) without being marked `engine_process`: the marking cannot rot silently."""
    if request.node.get_closest_marker("engine_process") is not None:
        return
    from multiprocessing.process import BaseProcess

    def start(self: BaseProcess) -> None:
        raise AssertionError(
            f"{request.node.nodeid} starts a process ({self.name}) but is not marked "
            "engine_process: mark its module with `pytestmark = pytest.mark.engine_process`")

    monkeypatch.setattr(BaseProcess, "start", start)


# --- every test ------------------------------------------------------------------------------


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


# --- models ----------------------------------------------------------------------------------


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
    from engine.bench.random_models import ModelKind, write_tiny_model

    out = tmp_path_factory.mktemp("models")
    return {
        kind.value: write_tiny_model(
            ModelKind(kind.value), out / f"tiny-{kind.value}.gguf", smollm2_path
        )
        for kind in ALL_KINDS
    }


@pytest.fixture(scope="session")
def vendored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real models' chat templates (`templates/NAME.jinja`) and vocabularies
    (`ggml-vocab-NAME.gguf`) from the vendored llama.cpp (tests/fixtures/vendored.py)."""
    from tests.fixtures import vendored

    return vendored.extract(tmp_path_factory.mktemp("vendored"))


TOOLS_TEMPLATE = Path(__file__).parent / "fixtures" / "hermes_tools_template.jinja"


@pytest.fixture(scope="session")
def tool_models(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path
                ) -> dict[str, Path]:
    """The tiny models of every memory kind with a chat template that takes tools and
    writes Hermes/Qwen calls (tests/fixtures/hermes_tools_template.jinja)."""
    from engine.bench.random_models import ModelKind, write_tiny_model

    out = tmp_path_factory.mktemp("tool-models")
    template = TOOLS_TEMPLATE.read_text(encoding="utf-8")
    return {
        kind.value: write_tiny_model(ModelKind(kind.value), out / f"tools-{kind.value}.gguf",
                                     smollm2_path, chat_template=template)
        for kind in ALL_KINDS
    }


def __getattr__(name: str) -> object:
    """`QUANTS` (every quantization the tiny models come in), imported on first use: it
    needs the GGUF writer, which a test without a model never loads."""
    if name == "QUANTS":
        from engine.bench.random_models import Quant

        return list(Quant)
    raise AttributeError(name)


@pytest.fixture(scope="session")
def quantized_models(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path
) -> Callable[[MemoryKind, Quant], Path]:
    """A tiny model of a memory kind in a quantization, written on first use. Block
    quantizations come from the gguf package; Q4_K_M from llama.cpp's quantizer, 256 wide."""
    from engine.bench.random_models import ModelKind, Quant, write_tiny_model

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


RuntimeFactory = Callable[..., "Runtime"]


@pytest.fixture
def make_runtime() -> Iterator[RuntimeFactory]:
    """Open runtimes and close them all at the end of the test."""
    from engine.llm.runtime import Runtime, RuntimeSettings

    opened: list[Runtime] = []

    def factory(path: Path, **settings: object) -> Runtime:
        runtime = Runtime(path, RuntimeSettings(**settings))  # type: ignore[arg-type]
        opened.append(runtime)
        return runtime

    yield factory
    for runtime in opened:
        runtime.close()
