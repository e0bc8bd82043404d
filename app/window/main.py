"""`arbor`: the desktop program."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication, QMessageBox

from app.look.theme import apply_theme
from app.state.engine_client import ProcessEngine
from app.window.logs import engine_log, setup_logging
from app.window.main_window import MainWindow
from engine.config.settings import load_settings
from engine.core.errors import ArborError
from engine.files.paths import data_dirs
from engine.models.files import list_models
from engine.storage.store import Store

log = logging.getLogger(__name__)


def main() -> int:
    if "--self-test" in sys.argv[1:]:
        from app.window.self_test import run_self_test

        return run_self_test()
    setup_logging()
    app = QApplication(sys.argv)
    app.setApplicationName("Arbor")
    app.setOrganizationName("Arbor")
    loaded = load_settings()  # never raises: a bad file gives the defaults and a problem
    apply_theme(app, loaded.settings.theme)
    try:
        store = Store()
    except ArborError as exc:
        # The database is kept as it is; nothing is written over it.
        QMessageBox.critical(None, "Arbor", f"Your conversations could not be opened.\n\n{exc}")
        return 1
    window = MainWindow(store=store, settings=loaded.settings,
                        engine=ProcessEngine(log_file=engine_log()))
    window.show()
    if loaded.problem:
        # Once, after the window is up; the file stays as it is until the user saves settings.
        QMessageBox.warning(window, "Arbor", f"About your settings:\n\n{loaded.problem}")
    model = startup_model(loaded.settings.model)
    if model is not None:
        window.models.load_model(str(model))
    else:
        QMessageBox.warning(window, "Arbor", "No model found: open a GGUF file (Ctrl+O).")
    return app.exec()


def startup_model(last: str | None) -> Path | None:
    """The model loaded last time if it is still there, else the bundled default or the
    first one in the models folder."""
    if last and Path(last).is_file():
        return Path(last)
    models = list_models(data_dirs())
    return models[0] if models else None


if __name__ == "__main__":
    sys.exit(main())
