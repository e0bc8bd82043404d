"""The engine never imports Qt or the app (DESIGN.md: the arrow points one way)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import engine

ROOT = Path(__file__).resolve().parents[1]


def test_importing_every_engine_module_loads_no_qt_and_no_app() -> None:
    modules = sorted(m.name for m in pkgutil.walk_packages(engine.__path__, "engine."))
    assert "engine.runtime" in modules and "engine.cli" in modules  # the walk found them
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    if name != 'engine.__main__':\n"
        "        importlib.import_module(name)\n"
        "roots = ('PySide6', 'shiboken6', 'app')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in roots)\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "", f"engine imported: {result.stdout.strip()}"


def test_the_check_would_notice_a_qt_import() -> None:
    """Guard against a check that cannot fail: importing app does pull in PySide6."""
    code = "import sys, app.worker; print('PySide6' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "True"
