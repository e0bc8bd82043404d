"""Before the window opens on Linux: the system libraries Qt's X11 plugin needs, named as
Debian/Ubuntu packages in one line instead of Qt's "could not load the Qt platform plugin".

    python -m app.window.system_check      # exit 0, or 1 and the `apt install` line

Reads the plugin's dependencies with `ldd`; imports nothing from Qt (a missing library is
what it looks for)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

# Shared object -> the Debian/Ubuntu package that has it.
PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libOpenGL.so.0": "libopengl0",
    "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0",
}


def xcb_plugin() -> Path | None:
    spec = importlib.util.find_spec("PySide6")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return path if path.is_file() else None


def missing_libraries(plugin: Path) -> list[str]:
    """The shared objects `ldd` cannot find for `plugin` (and what it loads)."""
    if shutil.which("ldd") is None:
        return []
    done = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=False)
    missing = [line.split("=>")[0].strip() for line in done.stdout.splitlines()
               if "not found" in line]
    return sorted(set(missing))


def problem() -> str | None:
    """One line naming what to install, or None when the window can open."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM", "xcb") != "xcb":
        return None
    plugin = xcb_plugin()
    if plugin is None:
        return None
    missing = missing_libraries(plugin)
    if not missing:
        return None
    packages = sorted({PACKAGES.get(name, name) for name in missing})
    return (f"Arbor's window needs system libraries that are missing: sudo apt install "
            f"{' '.join(packages)}")


def main() -> int:
    found = problem()
    if found is None:
        return 0
    sys.stderr.write(found + "\n")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
