"""Where the program's messages go when nobody watches a terminal: a rotating file in the
platform's log folder (Help > Open log folder), and the stack of a native crash next to it."""

from __future__ import annotations

import faulthandler
import logging
import logging.handlers
import sys
from pathlib import Path
from typing import TextIO

from engine.files.paths import data_dirs

LOG_BYTES = 1 << 20
LOG_BACKUPS = 3
_crash_file: TextIO | None = None  # open for the life of the process (faulthandler's)


def setup_logging(level: int = logging.INFO) -> Path:
    """Log to `<logs>/arbor.log` (rotated) and to stderr when there is one; native crashes
    to `<logs>/crash.log`. Returns the folder. A folder that cannot be written leaves
    logging on stderr only."""
    global _crash_file
    folder = data_dirs().logs
    root = logging.getLogger()
    root.setLevel(level)
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    if sys.stderr is not None:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(console)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            folder / "arbor.log", maxBytes=LOG_BYTES, backupCount=LOG_BACKUPS,
            encoding="utf-8")
        _crash_file = (folder / "crash.log").open("a", encoding="utf-8")
    except OSError as exc:
        logging.getLogger(__name__).warning("cannot write logs to %s: %s", folder, exc)
        return folder
    handler.setFormatter(formatter)
    root.addHandler(handler)
    faulthandler.enable(file=_crash_file)
    return folder


def engine_log() -> Path:
    """The window's engine process writes its stderr here (llama.cpp's messages too)."""
    return data_dirs().logs / "engine.log"
