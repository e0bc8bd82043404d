"""Benchmark: how long File > Import pauses the window on a big ChatGPT export.

Writes a ChatGPT `conversations.json` of 1,500 conversations (20 messages each, ~41 MB),
imports it through the real main window, and reports the whole import's time and the largest
gaps between the ticks of a 10 ms timer on the GUI thread: how long the window could not
repaint or react.

    QT_QPA_PLATFORM=offscreen .venv/bin/python -m tests.bench.bench_import [--conversations N]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path


def write_export(path: Path, conversations: int, seed: int = 1) -> None:
    from engine.core.records import from_tree
    from engine.core.tree import Role, Tree
    from engine.storage.formats.chatgpt_export import export_chatgpt

    rng = random.Random(seed)
    records = []
    for index in range(conversations):
        tree = Tree("")
        for _ in range(10):
            user = tree.add_child(tree.active_leaf, Role.USER,
                                  "question " + "lorem ipsum " * rng.randrange(5, 80))
            tree.add_child(user.id, Role.ASSISTANT,
                           "answer " + "dolor sit amet " * rng.randrange(10, 150))
        records.append(from_tree(tree, title=f"conversation {index}"))
    path.write_bytes(export_chatgpt(records))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=1500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ARBOR_HOME"] = str(Path(tmp) / "home")
        from PySide6.QtCore import QEventLoop, QTimer
        from PySide6.QtWidgets import QApplication

        from app.window.main_window import MainWindow
        from engine.storage.store import Store

        app = QApplication([])
        source = Path(tmp) / "conversations.json"
        write_export(source, args.conversations)
        window = MainWindow(store=Store(Path(tmp) / "c.db"))
        window.show()
        gaps: list[float] = []
        last = [time.perf_counter()]

        def tick() -> None:
            now = time.perf_counter()
            gaps.append(now - last[0])
            last[0] = now

        timer = QTimer()
        timer.timeout.connect(tick)
        timer.start(10)
        loop = QEventLoop()
        window.files.import_finished.connect(loop.quit)
        started = time.perf_counter()
        window.files.import_path(source)
        last[0] = time.perf_counter()
        loop.exec()
        gaps.append(time.perf_counter() - last[0])  # the pause that ended the import
        total = time.perf_counter() - started
        gaps.sort()
        print(f"{source.stat().st_size / 1e6:.0f} MB, {args.conversations} conversations: "
              f"import {total:.1f} s; longest pauses of the window "
              f"{gaps[-1] * 1000:.0f} ms, {gaps[-2] * 1000:.0f} ms; 99th percentile "
              f"{gaps[int(len(gaps) * 0.99)] * 1000:.0f} ms")
        window.close()
        del app
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
