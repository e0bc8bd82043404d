"""Render the main window with sample conversations into PNGs for the README: a branching
conversation in the light and the dark theme (main-window, main-window-dark) and a reply with
highlighted code blocks (code-blocks).

    QT_QPA_PLATFORM=offscreen .venv/bin/python -m app.screenshots resources/screenshots
    QT_QPA_PLATFORM=offscreen .venv/bin/python -m app.screenshots resources/screenshots code-blocks
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

SAMPLE = [
    ("user", "What makes oak trees live so long?"),
    ("assistant", "Oaks grow slowly and build **dense, decay-resistant wood**. They also:\n\n"
                  "- shed damaged limbs instead of rotting from them,\n"
                  "- keep deep roots that reach water in droughts,\n"
                  "- make tannins that deter insects and fungi."),
    ("user", "How deep do the roots go?"),
    ("assistant", "Usually within the top metre, spreading wide; a taproot can reach "
                  "`4-5 m` in young trees."),
]

CODE_SAMPLE = [
    ("user", "How do I read a CSV file into dictionaries in Python?"),
    ("assistant", "Use `csv.DictReader`: each row comes back as a `dict` keyed by the header.\n\n"
                  "```python\nimport csv\nfrom pathlib import Path\n\n\n"
                  "def read_rows(path: Path) -> list[dict[str, str]]:\n"
                  "    \"\"\"Every row of a CSV file, keyed by its header.\"\"\"\n"
                  "    with path.open(newline=\"\", encoding=\"utf-8\") as f:\n"
                  "        return list(csv.DictReader(f))  # the header is the first row\n\n\n"
                  "rows = read_rows(Path(\"trees.csv\"))\n"
                  "print(len(rows), rows[0][\"species\"])\n```\n\n"
                  "To check the file first:\n\n"
                  "```bash\nhead -n 3 trees.csv | column -s, -t\n```"),
]
SHOTS = ("main-window", "code-blocks")


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "resources/screenshots")
    shots = argv[1:] or list(SHOTS)
    unknown = sorted(set(shots) - set(SHOTS))
    if unknown:
        raise SystemExit(f"unknown screenshots {unknown}; these exist: {', '.join(SHOTS)}")
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["ARBOR_HOME"] = tempfile.mkdtemp(prefix="arbor-shots-")
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.theme import apply_theme
    from engine.model import default_model_path
    from engine.settings import Theme
    from engine.store import Store
    from engine.tree import Role, Tree

    app = QApplication(sys.argv[:1])
    apply_theme(app, Theme.LIGHT)
    tree = Tree("You are a concise botanist.")
    for role, text in SAMPLE:
        tree.add_child(tree.active_leaf, Role(role), text)
    tree.add_sibling(tree.message(2).id, "How tall can an oak grow?")
    tree.add_child(tree.active_leaf, Role.ASSISTANT, "Most reach 20-30 m; a few exceed 40 m.")
    tree.switch_variant(tree.message(2).id, 0)
    store = Store()
    code = Tree("You are a helpful programmer.")
    for role, text in CODE_SAMPLE:
        code.add_child(code.active_leaf, Role(role), text)
    code_id = store.create(code, title="Reading a CSV in Python")
    store.create(Tree(), title="Rivers and deltas")
    store.create(tree, title="Why oaks live long")
    window = MainWindow(store=store)
    window.resize(1280, 760)
    window.show()
    loop = QEventLoop()
    window.model_ready.connect(loop.quit)
    QTimer.singleShot(60_000, loop.quit)
    window.models.load_model(str(default_model_path()))
    loop.exec()
    app.processEvents()
    saved: list[Path] = []
    if "main-window" in shots:
        window.grab().save(str(out / "main-window.png"))
        apply_theme(app, Theme.DARK)
        app.processEvents()
        window.grab().save(str(out / "main-window-dark.png"))
        saved += [out / "main-window.png", out / "main-window-dark.png"]
    if "code-blocks" in shots:
        apply_theme(app, Theme.LIGHT)
        window.controller.open_conversation(code_id)
        app.processEvents()
        window.grab().save(str(out / "code-blocks.png"))
        saved.append(out / "code-blocks.png")
    window.close()
    print(*saved)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
