"""llama.cpp's kernels on the computers people have: the portable build's CPU library chosen
at run time, an engine whose fast kernels crash falling back, once, to running without them,
and GPU layers fitted by llama.cpp.

The crashes here are made on purpose (tests/engine_faults.py: a SIGSEGV where llama.cpp's
AMX kernels fault on such a CPU), never llama.cpp's own bugs: the tests pass on any CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

import engine.service.process
from app.state.engine_client import ProcessEngine
from app.window.main_window import MainWindow
from engine.config.params import GPU_LAYERS_FIT, ContextParams
from engine.config.settings import Settings
from engine.core.tree import NodeStatus, Role
from engine.files.paths import data_dirs
from engine.llm.backends import Backends, choose_cpu_variant, cpu_variants, library_dir
from engine.llm.cpu import cpu_flags
from engine.llm.llama import (
    FIT_MARGIN_BYTES,
    fit_gpu_layers,
    gpu_devices,
    gpu_memory,
    native_backends,
)
from engine.llm.repack import CRASHED, KNOWN_BAD, RepackGuard, note_exit
from engine.llm.runtime import Runtime
from engine.service.client import ProcessClient
from engine.service.process import EngineProcess
from engine.service.protocol import Crash, CrashKind, EngineStarted
from tests import engine_faults
from tests.app_fixtures import TIMEOUT, destroy, open_window, send, warnings_shown

# Kernel faults are engine processes that crash: several tests start them without a fixture.
pytestmark = pytest.mark.engine_process

ROOT = Path(__file__).resolve().parents[3]
PORTABLE = Backends(portable=True, cpu_variant="zen4")


# --- the CPU library ------------------------------------------------------------------------


def test_the_best_cpu_library_this_cpu_runs_is_chosen_and_amx_is_left_out_on_an_amx_cpu(
) -> None:
    scores = {"x64": 1, "haswell": 40, "zen4": 200, "sapphirerapids": 400, "alderlake": 0}
    amx = {"sapphirerapids"}.__contains__
    assert choose_cpu_variant(scores, False, amx) == ("sapphirerapids", [])
    chosen, skipped = choose_cpu_variant(scores, True, amx)
    assert chosen == "zen4" and len(skipped) == 1 and "sapphirerapids" in skipped[0]
    assert choose_cpu_variant({"x64": 0}, False, amx) == (None, [])


def test_this_build_loads_the_best_portable_cpu_library_for_this_cpu() -> None:
    """`make` builds llama.cpp portable: the CPU libraries sit beside libllama and the one
    chosen is one this CPU runs (on an AVX-512 CPU, an AVX-512 one)."""
    variants = cpu_variants(library_dir())
    assert {"x64", "sse42", "haswell", "skylakex", "sapphirerapids"} <= set(variants)
    native = native_backends()
    assert native.portable and native.cpu_variant in variants
    assert "rpc" in native.loaded
    flags = cpu_flags()
    features = native.cpu_features
    if "avx2" in flags:
        assert features.get("AVX2") == "1"
    if "avx512f" in flags:
        assert features.get("AVX512") == "1"


@pytest.mark.model  # the bundled model, in the child process
def test_arbor_engine_kernels_reports_what_runs_and_decodes_in_its_own_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "engine", "kernels", "--prompt", "40", "--generate", "4"],
        cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["portable_build"] and report["cpu_variant"] == native_backends().cpu_variant
    assert report["repacking"] is True and report["kernels"] == report["cpu_variant"]
    assert report["prompt_tok_s"] > 0 and report["generate_tok_s"] > 0


# --- the fallback's record ------------------------------------------------------------------


def _guard(model: Path, backends: Backends = PORTABLE) -> RepackGuard:
    return RepackGuard(model, backends)


def test_a_fault_while_armed_records_the_fallback_and_it_is_told_once(
    smollm2_path: Path,
) -> None:
    guard = _guard(smollm2_path)
    assert guard.decide().repack
    guard.arm()
    words = note_exit(os.getpid(), -signal.SIGSEGV)
    assert words is not None and "crashed on this CPU" in words
    first = _guard(smollm2_path).decide()
    assert not first.repack and first.notice is not None and first.notice.startswith(CRASHED)
    again = _guard(smollm2_path).decide()
    assert not again.repack and again.notice is None  # told once


@pytest.mark.parametrize("exitcode", [-signal.SIGKILL, -signal.SIGABRT, 0, 1, None])
def test_being_killed_aborting_or_exiting_is_no_kernel_fault(
    smollm2_path: Path, exitcode: int | None,
) -> None:
    guard = _guard(smollm2_path)
    guard.arm()
    assert note_exit(os.getpid(), exitcode) is None
    assert _guard(smollm2_path).decide().repack
    assert not list((data_dirs().cache / "kernels").glob("pending-*"))


def test_a_disarmed_guard_leaves_nothing_for_a_later_fault(smollm2_path: Path) -> None:
    guard = _guard(smollm2_path)
    guard.arm()
    guard.disarm()  # the first prompt decoded
    assert note_exit(os.getpid(), -signal.SIGSEGV) is None
    assert _guard(smollm2_path).decide().repack


def test_the_record_is_per_model_build_and_cpu(
    smollm2_path: Path, gemma_path: Path,
) -> None:
    _guard(smollm2_path).arm()
    note_exit(os.getpid(), -signal.SIGSEGV)
    assert not _guard(smollm2_path).decide().repack
    assert _guard(gemma_path).decide().repack  # another model
    assert _guard(smollm2_path, Backends(portable=True, cpu_variant="haswell")).decide().repack


def test_amx_kernels_linked_in_on_an_amx_cpu_turn_repacking_off_up_front(
    smollm2_path: Path,
) -> None:
    native = Backends(portable=False, cpu_variant="native", repack_known_bad=True)
    decision = _guard(smollm2_path, native).decide()
    assert not decision.repack and decision.notice is not None
    assert decision.notice.startswith(KNOWN_BAD)


# --- engines that crash on purpose ----------------------------------------------------------


@pytest.fixture
def windows(qtbot: QtBot, tmp_path: Path) -> Iterator[Callable[[Path], MainWindow]]:
    """Open a window on a model with the engine process as the app runs it (whatever
    `engine.service.process.child_main` is now); closed and destroyed after the test."""
    opened: list[MainWindow] = []

    def open_on(model: Path) -> MainWindow:
        opened.append(open_window(qtbot, tmp_path, model, ProcessEngine()))
        return opened[-1]

    yield open_on
    for window in opened:
        window.close()
        destroy(window)


def _details(window: MainWindow) -> dict[str, object]:
    model = window.replies.model
    assert model is not None
    return dict(model.details)


def test_kernels_that_crash_in_the_canary_cost_one_restart_then_never_again(
    qtbot: QtBot, windows: Callable[[Path], MainWindow], smollm2_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = warnings_shown(monkeypatch)
    monkeypatch.setattr(engine.service.process, "child_main", engine_faults.faults_while_repacking)
    notices: list[str] = []
    window = windows(smollm2_path)
    assert len(shown) == 1 and "optimized kernels crashed on this CPU" in shown[0]
    assert "Loading the model again" in shown[0] and "Traceback" not in shown[0]
    model = window.replies.model
    assert model is not None and any(n.startswith(CRASHED) for n in model.notices)
    assert str(_details(window)["kernels"]).endswith("no repacking")
    send(qtbot, window, "Hello")
    assert window.tree.messages()[-1].role is Role.ASSISTANT
    # A new engine (killed: no fault) loads without repacking at once, and says nothing.
    window.replies.model_ready.connect(
        lambda: notices.extend(window.replies.model.notices if window.replies.model
                               else ()))
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):
        assert isinstance(window.engine, ProcessEngine)
        window.engine.send(Crash(CrashKind.KILL))
    assert len(shown) == 2 and "killed" in shown[1]
    assert notices == [] and str(_details(window)["kernels"]).endswith("no repacking")


def test_kernels_that_crash_on_the_first_prompt_get_the_question_answered_after_the_reload(
    qtbot: QtBot, windows: Callable[[Path], MainWindow], smollm2_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = warnings_shown(monkeypatch)
    monkeypatch.setattr(engine.service.process,
                        "child_main", engine_faults.faults_on_the_first_prompt)
    window = windows(smollm2_path)
    assert shown == [] and _details(window)["kernels"] == native_backends().cpu_variant
    window.composer.setPlainText("Name a colour.")
    qtbot.keyClick(window.composer, Qt.Key.Key_Return)

    def answered() -> bool:
        last = window.tree.messages()[-1]
        return window.replies.streaming is None and last.role is Role.ASSISTANT \
            and last.status is NodeStatus.COMPLETE

    qtbot.waitUntil(answered, timeout=TIMEOUT)
    assert len(shown) == 1 and "optimized kernels crashed" in shown[0]
    assert [m.role for m in window.tree.messages()] == [Role.USER, Role.ASSISTANT]
    assert str(_details(window)["kernels"]).endswith("no repacking")


def test_the_command_line_engine_starts_again_without_the_kernels_that_crashed(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine.service.process, "child_main", engine_faults.faults_while_repacking)
    replier = ProcessClient(EngineProcess())
    try:
        loaded = replier.load(str(smollm2_path), settings=Settings(max_tokens=8))
        assert str(dict(loaded.details)["kernels"]).endswith("no repacking")
        assert any(n.startswith(CRASHED) for n in loaded.notices)
    finally:
        replier.close()


@pytest.mark.parametrize("args", [["no-such-model.gguf"], ["--rounds", "-1"],
                                  ["--prompt", "1"], ["--generate", "0"]])
def test_arbor_engine_kernels_refuses_bad_input_in_one_line(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "engine", "kernels", *args], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


# --- GPU layers -----------------------------------------------------------------------------


def test_llama_cpps_fit_runs_through_its_binding_and_leaves_a_cpu_machine_as_it_is(
    smollm2_path: Path,
) -> None:
    """`common_fit_params` measures the model and context without allocating; with no GPU it
    only checks host memory and changes nothing. What it would do on a GPU is not checked
    here (no GPU on this project's machines): this proves the hand-made binding calls it."""
    fit = fit_gpu_layers(smollm2_path, ContextParams(n_ctx=2048, n_batch=512))
    assert fit is not None and fit.ok and fit.n_gpu_layers == -1
    assert not any(fit.tensor_split) and fit.overrides[0].pattern is None


def test_all_that_fit_is_the_default_and_runs_on_the_cpu_without_a_word_here(
    smollm2_path: Path,
) -> None:
    settings = Settings()
    assert settings.n_gpu_layers == GPU_LAYERS_FIT
    runtime = Runtime(smollm2_path, settings.runtime())
    try:
        assert gpu_devices() or (runtime.backend == "CPU" and runtime.gpu_layers == 0
                                 and runtime.notices == [])
    finally:
        runtime.close()


def test_the_gpus_memory_is_measured_in_the_engine_process_and_none_without_a_gpu() -> None:
    """`gpu_memory` sums this machine's GPUs; the engine process sends it first, for the
    window's Discover (this project's machines have no GPU: None, from both)."""
    devices = gpu_devices()
    memory = gpu_memory()
    if devices:
        assert memory is not None and 0 < memory.free <= memory.total
        assert memory.margin == FIT_MARGIN_BYTES * len(devices)
    else:
        assert memory is None
    process = EngineProcess()
    try:
        assert process.poll(TIMEOUT), "the engine did not start"
        started = process.recv()
        assert isinstance(started, EngineStarted)
        assert (started.gpu is None) == (memory is None)
    finally:
        process.shutdown()


def test_a_deeply_nested_record_file_is_no_record(smollm2_path: Path) -> None:
    folder = data_dirs().cache / "kernels"
    folder.mkdir(parents=True)
    (folder / "faults.json").write_text("{\"a\":" * 100_000 + "1" + "}" * 100_000)
    assert _guard(smollm2_path).decide().repack
