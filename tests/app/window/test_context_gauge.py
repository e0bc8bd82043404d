"""The context gauge: the branch's own tokens against the context, and a warning near full."""

from __future__ import annotations

from dataclasses import replace

from pytestqt.qtbot import QtBot

from app.window.context_gauge import WARN_AT, branch_fill
from app.window.main_window import MainWindow
from engine.core.overflow import Overflow
from engine.core.tree import Node, Role
from tests.app_fixtures import send
from tests.fake_engine import Script


def test_the_gauge_counts_the_branchs_tokens_exactly(qtbot: QtBot, fake_window: MainWindow) -> None:
    send(qtbot, fake_window, "Hello there")
    qtbot.waitUntil(lambda: all(n.tokens is not None for n in fake_window.tree.active_path()),
                    timeout=60_000)
    fake_window.context_gauge.update()
    model = fake_window.replies.model
    assert model is not None
    expected = sum(len(n.tokens or ()) for n in fake_window.tree.active_path())
    bar = fake_window.context_bar
    assert (bar.value(), bar.maximum()) == (expected, model.n_ctx)
    assert bar.format() == f"context {expected:,} / {model.n_ctx:,}" and expected > 0
    assert "may not fit" not in bar.toolTip()
    # A message not rendered yet is estimated, and the gauge says so.
    fake_window.controller.conversation.tree.add_child(fake_window.tree.active_leaf, Role.USER,
                                                  "x" * 300)
    fake_window.context_gauge.update()
    assert bar.format().startswith("context about ") and bar.value() == expected + 100


def test_the_gauge_warns_before_the_context_is_full(
    qtbot: QtBot, fake_window: MainWindow, fake_engine: Script
) -> None:
    fake_engine.reply = lambda prompt, _seed: " ".join([prompt] * 4)  # a long reply
    model = fake_window.replies.model
    assert model is not None
    fake_window.replies.model = replace(model, n_ctx=64)  # a tiny context: one message fills it
    send(qtbot, fake_window, "A message long enough to fill most of a tiny context, surely.")
    fake_window.context_gauge.update()
    fill = fake_window.context_gauge.fill
    assert fill is not None and fill.tokens >= WARN_AT * 64 and fill.warn
    assert "may not fit" in fake_window.context_bar.toolTip()


def test_unrendered_text_is_estimated_from_its_length() -> None:
    nodes = [Node(0, None, Role.SYSTEM, "", 0.0, tokens=(1, 2)),
             Node(1, 0, Role.USER, "abcdefg", 0.0)]
    fill = branch_fill(nodes, 100)
    assert (fill.tokens, fill.exact, fill.warn) == (2 + 3, False, False)


def test_near_full_warns_under_stop_but_not_when_the_oldest_are_left_out() -> None:
    def turns(*lengths: int) -> list[Node]:
        nodes = [Node(0, None, Role.SYSTEM, "", 0.0, tokens=(1,) * 10)]
        for i, n in enumerate(lengths, start=1):
            role = Role.USER if i % 2 else Role.ASSISTANT
            nodes.append(Node(i, i - 1, role, "", 0.0, tokens=(1,) * n))
        return nodes

    near = turns(40, 30, 40, 30, 25)  # 175 of 200: past WARN_AT, still fits
    assert branch_fill(near, 200).warn
    dropping = branch_fill(near, 200, overflow=Overflow.DROP_OLDEST, max_tokens=40)
    assert dropping.dropping and not dropping.warn and dropping.tokens + 40 <= 200
    # One message too long to answer, even alone: that warns under either policy.
    huge = turns(40, 30, 180)
    assert branch_fill(huge, 200, overflow=Overflow.DROP_OLDEST, max_tokens=40).warn
