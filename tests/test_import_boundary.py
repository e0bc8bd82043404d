"""Import contracts: the engine never imports Qt or the app (DESIGN.md: the arrow points one
way), and only the llama.cpp layer loads llama.cpp."""

from __future__ import annotations

import ast
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import engine

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (a clean sys.modules) from the repository root."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )


def test_importing_every_engine_module_loads_no_qt_and_no_app() -> None:
    modules = sorted(m.name for m in pkgutil.walk_packages(engine.__path__, "engine."))
    assert "engine.llm.runtime" in modules and "engine.cli.main" in modules  # the walk found them
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    if name != 'engine.__main__':\n"
        "        importlib.import_module(name)\n"
        "roots = ('PySide6', 'shiboken6', 'app')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in roots)\n"
        "print(','.join(bad))\n"
    )
    result = _python(code)
    assert result.stdout.strip() == "", f"engine imported: {result.stdout.strip()}"


def test_the_check_would_notice_a_qt_import() -> None:
    """Guard against a check that cannot fail: importing app does pull in PySide6."""
    code = "import sys, app.state.engine_client; print('PySide6' in sys.modules)"
    result = _python(code)
    assert result.stdout.strip() == "True"


# Modules that run a model: they may load llama.cpp's native library. Everything else in the
# engine (settings, scenarios, the store, files, the command line's other commands) and the
# app's value and widget modules must not: they are read where no model is loaded.
NATIVE = {"engine.llm.llama", "engine.llm.runtime", "engine.llm.generator",
          "engine.service.session", "engine.service.replay", "engine.bench.limits",
          "engine.llm.kernels", "engine.llm.placement", "engine.service.handler"}
NATIVE_FREE_APP = ["app.window.main_window", "app.state.controller", "app.state.replies",
                   "app.state.engine_client", "app.look.theme", "app.look.icons",
                   "app.dialogs.settings_dialog", "app.dialogs.model_picker", "app.look.actions",
                   "app.window.sidebar", "app.chat.chat_model", "app.tree.tree_panel",
                   "app.state.importer"]


def test_only_the_llama_cpp_layer_imports_llama_cpp() -> None:
    """The static half of the contract: no other module names it in an import."""
    offenders = []
    for path in sorted([*(ROOT / "engine").rglob("*.py"), *(ROOT / "app").rglob("*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )
            if any(name.split(".")[0] == "llama_cpp" for name in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == ["engine/llm/llama.py"]


def test_modules_that_run_no_model_do_not_load_the_native_library() -> None:
    modules = sorted(m.name for m in pkgutil.walk_packages(engine.__path__, "engine."))
    free = [m for m in modules if m not in NATIVE and m != "engine.__main__"]
    assert {"engine.config.settings", "engine.service.scenario", "engine.cli.main"} <= set(free)
    code = (
        "import importlib, sys\n"
        f"for name in {[*free, *NATIVE_FREE_APP]!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'llama_cpp' in sys.modules:\n"
        "        print(name)\n"
        "        break\n"
    )
    result = _python(code)
    assert result.stdout.strip() == "", f"{result.stdout.strip()} loaded llama_cpp"
    # The check can fail: the runtime does load it.
    probe = "import sys, engine.llm.runtime; print('llama_cpp' in sys.modules)"
    result = _python(probe)
    assert result.stdout.strip() == "True"


@pytest.mark.window  # the app's window and its engine process, in a child process
@pytest.mark.engine_process
def test_the_window_answers_without_loading_llama_cpp_in_its_own_process(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """The app's window, a model loaded and a reply answered: llama.cpp ran, but only in the
    engine's process."""
    code = f"""
import sys
from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication
from app.window.main_window import MainWindow
from engine.config.settings import Settings
from engine.storage.store import Store
app = QApplication([])
from pathlib import Path
window = MainWindow(store=Store(Path({str(tmp_path / "c.db")!r})), settings=Settings(max_tokens=8))
loop = QEventLoop()
window.model_ready.connect(loop.quit)
window.reply_finished.connect(loop.quit)
QTimer.singleShot(240_000, loop.quit)  # a hang guard
window.models.load_model({str(tiny_models["dense"])!r})
loop.exec()
window.controller.send("Hello")
loop.exec()
print(len(window.tree.messages()), window.replies.engine_pid is not None,
      "llama_cpp" in sys.modules)
window.close()
"""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "ARBOR_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, check=True, env=env)
    assert result.stdout.split() == ["2", "True", "False"], result.stderr
