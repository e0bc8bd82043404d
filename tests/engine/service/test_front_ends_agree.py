"""The window and the command line drive the same conversation core: the same operations
give the same tree (shape, texts, tokens) and the same replies."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytestqt.qtbot import QtBot

from app.window.main_window import MainWindow
from engine.core.tree import Role, Tree
from engine.storage.store import Store
from tests.app_fixtures import TIMEOUT, send

ROOT = Path(__file__).resolve().parents[3]
STEPS: list[dict[str, Any]] = [
    {"op": "send", "text": "Tell me about oaks."},
    {"op": "send", "text": "And their roots?"},
    {"op": "edit", "message": 0, "text": "Tell me about rivers."},
    {"op": "regenerate"},
    {"op": "switch", "message": 0, "variant": 0},
    {"op": "send", "text": "Thanks. One more?"},
    {"op": "regenerate", "message": 1},
]


def _shape(tree: Tree) -> list[tuple[Any, ...]]:
    nodes = sorted(
        (n.id, n.parent, n.role.value, n.text, n.tokens, tuple(n.children), n.status.value)
        for n in tree.nodes()
    )
    return [*nodes, ("active", tree.active_leaf)]


def _drive_window(qtbot: QtBot, win: MainWindow) -> None:
    def wait_reply() -> None:
        qtbot.waitUntil(lambda: win.replies.streaming is None, timeout=TIMEOUT)

    for step in STEPS:
        messages = win.tree.messages()
        op = step["op"]
        if op == "send":
            send(qtbot, win, step["text"])
        elif op == "edit":
            win.controller.edit(messages[step["message"]].id, step["text"])
            wait_reply()
        elif op == "regenerate":
            target = messages[step["message"]] if "message" in step else messages[-1]
            win.controller.regenerate(target.id)
            wait_reply()
        elif op == "switch":
            win.controller.switch_variant(messages[step["message"]].id, step["variant"])


def test_the_window_and_replay_build_the_same_tree_and_replies(
    qtbot: QtBot, window: MainWindow, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    settings = replace(window.settings, seed=7, temperature=0.7, max_tokens=12)
    window.models.apply_settings(settings)
    window.controller.new_conversation()
    _drive_window(qtbot, window)

    sampling = settings.sampling()
    scenario = {
        "model": str(tiny_models["dense"]), "n_ctx": settings.n_ctx, "n_batch": 512, "seed": 7,
        "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k,
                     "top_p": sampling.top_p, "min_p": sampling.min_p},
        "steps": [{**s, "max_tokens": 12} if s["op"] in ("send", "edit", "regenerate") else s
                  for s in STEPS],
    }
    path, db, report = tmp_path / "s.json", tmp_path / "replay.db", tmp_path / "r.json"
    path.write_text(json.dumps(scenario))
    # The command line in its own process (llama.cpp runs only on the window's engine thread
    # in this one).
    subprocess.run([sys.executable, "-m", "engine", "replay", str(path), "--db", str(db),
                    "--report", str(report)], cwd=ROOT, check=True, capture_output=True)
    with Store(db) as store:
        replayed = store.load(json.loads(report.read_text())["conversation_id"])
    assert _shape(window.tree) == _shape(replayed)
    replies = [n.text for n in replayed.nodes() if n.role is Role.ASSISTANT]
    assert len(replies) == 6 and all(replies)
