"""Import contracts. The layers (pyproject.toml's `[tool.importlinter]`, checked by
import-linter): a layer imports only the layers below it, the engine never imports Qt or the
app, and only `engine.llm.llama` imports llama.cpp. What a static graph cannot see is checked
here by importing: a module whose top-level imports do not reach `engine.llm.llama` must not
load llama.cpp's native library (a lazy import that leaks would), and the window's process
never loads it (docs/architecture.md, "The engine is Qt-free" and "Only
engine/llm/llama.py imports llama_cpp")."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LLAMA = "engine.llm.llama"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (a clean sys.modules) from the repository root."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )


def _lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    program = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert program is not None, "import-linter is not installed (pip install -e '.[test]')"
    return subprocess.run([program, "--no-cache", *args], cwd=ROOT, capture_output=True,
                          text=True, check=False)


def test_the_import_contracts_are_kept() -> None:
    result = _lint_imports()
    assert result.returncode == 0, result.stdout[-3000:]
    assert "4 kept, 0 broken" in result.stdout


def test_a_broken_layer_contract_is_noticed(tmp_path: Path) -> None:
    """The tool can fail: the same graph with the core put above the llama.cpp layer."""
    config = tmp_path / "contracts.toml"
    config.write_text('[tool.importlinter]\nroot_packages = ["engine"]\n'
                      '[[tool.importlinter.contracts]]\nname = "upside down"\n'
                      'type = "layers"\ncontainers = ["engine"]\nlayers = ["core", "llm"]\n')
    result = _lint_imports("--config", str(config))
    assert result.returncode != 0 and "upside down BROKEN" in result.stdout


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports() -> dict[str, set[str]]:
    """Each engine and app module's imports that run when it is imported: module level, not
    inside a function or under TYPE_CHECKING."""
    graph: dict[str, set[str]] = {}
    for path in sorted([*(ROOT / "engine").rglob("*.py"), *(ROOT / "app").rglob("*.py")]):
        name = _module_name(path)
        found: set[str] = set()
        body = list(ast.parse(path.read_text(encoding="utf-8")).body)
        while body:
            node = body.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                body.extend(node.orelse)
            elif isinstance(node, ast.If | ast.Try):
                body.extend([*node.body, *node.orelse, *getattr(node, "finalbody", [])])
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = found
    return graph


def _loads_llama(graph: dict[str, set[str]]) -> set[str]:
    """The modules whose top-level imports reach `engine.llm.llama`, directly or not."""
    reach = {LLAMA}
    grew = True
    while grew:
        grew = False
        for name, imports in graph.items():
            if name not in reach and imports & reach:
                reach.add(name)
                grew = True
    return reach


def test_modules_that_run_no_model_do_not_load_the_native_library() -> None:
    graph = _top_level_imports()
    native = _loads_llama(graph)
    free = sorted(set(graph) - native - {"engine.__main__"})
    # What the window's process imports stays free; what runs a model does not.
    assert {"app.window.main_window", "app.state.controller", "engine.core.conversation",
            "engine.storage.store", "engine.config.settings", "engine.cli.main"} <= set(free)
    assert {"engine.llm.runtime", "engine.service.handler"} <= native
    code = (
        "import importlib, sys\n"
        f"for name in {free!r}:\n"
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


def test_importing_every_engine_module_loads_no_qt() -> None:
    """The contract's dynamic half: no engine module pulls Qt in by any route."""
    modules = sorted(name for name in _top_level_imports()
                     if name.startswith("engine") and name != "engine.__main__")
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "roots = ('PySide6', 'shiboken6', 'app')\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in roots)))\n"
    )
    result = _python(code)
    assert result.stdout.strip() == "", f"engine imported: {result.stdout.strip()}"
    probe = "import sys, app.state.engine_client; print('PySide6' in sys.modules)"
    assert _python(probe).stdout.strip() == "True"  # the check would notice


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
