"""`arbor`: the desktop program."""

from __future__ import annotations

import logging
import sys

from PySide6.QtWidgets import QApplication, QMessageBox

from app.main_window import MainWindow
from engine.errors import ArborError
from engine.model import list_models
from engine.paths import data_dirs
from engine.store import Store

log = logging.getLogger(__name__)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = QApplication(sys.argv)
    app.setApplicationName("Arbor")
    app.setOrganizationName("Arbor")
    try:
        store = Store()
    except ArborError as exc:
        # The database is kept as it is; nothing is written over it.
        QMessageBox.critical(None, "Arbor", f"Your conversations could not be opened.\n\n{exc}")
        return 1
    window = MainWindow(store=store)
    window.show()
    models = list_models(data_dirs())
    if models:
        window.load_model(str(models[0]))
    else:
        QMessageBox.warning(window, "Arbor", "No model found: open a GGUF file (Ctrl+O).")
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
