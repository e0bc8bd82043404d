"""How full the context is: the active branch's tokens against the model's context size.

Arbor knows the exact tokens of every node it has rendered; a node not rendered yet (a
message just typed, a branch never prepared) is estimated from its text and the gauge says
"about". Past WARN_AT of the context the gauge warns that the next message may not fit."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import QProgressBar

from app.controller import ChatController
from engine.tree import Node

WARN_AT = 0.85
CHARS_PER_TOKEN = 3  # for text not rendered yet: an over-estimate on English, on purpose


@dataclass(frozen=True)
class Fill:
    tokens: int
    n_ctx: int
    exact: bool  # every node of the branch has its tokens

    @property
    def warn(self) -> bool:
        return self.tokens >= WARN_AT * self.n_ctx


def branch_fill(path: list[Node], n_ctx: int) -> Fill:
    tokens = 0
    exact = True
    for node in path:
        if node.tokens is not None:
            tokens += len(node.tokens)
        else:
            exact = False
            tokens += -(-len(node.text) // CHARS_PER_TOKEN)
    return Fill(tokens, n_ctx, exact)


class ContextGauge(QObject):
    def __init__(self, controller: ChatController, bar: QProgressBar) -> None:
        super().__init__(bar)
        self.controller = controller
        self.bar = bar
        bar.setObjectName("context-gauge")
        bar.setMaximumWidth(220)
        bar.setTextVisible(True)
        self.fill: Fill | None = None
        replies = controller.replies
        for signal in (controller.changed, replies.model_changed, replies.reply_finished,
                       replies.warmed):
            signal.connect(self.update)
        self.update()

    @Slot()
    def update(self, *_args: object) -> None:
        model = self.controller.replies.model
        if model is None or self.controller.current is None:
            self.fill = None
            self.bar.setVisible(False)
            return
        fill = branch_fill(self.controller.tree.active_path(), model.n_ctx)
        self.fill = fill
        self.bar.setVisible(True)
        self.bar.setRange(0, fill.n_ctx)
        self.bar.setValue(min(fill.tokens, fill.n_ctx))
        about = "" if fill.exact else "about "
        self.bar.setFormat(f"context {about}{fill.tokens:,} / {fill.n_ctx:,}")
        tip = (f"This branch holds {about}{fill.tokens:,} of the {fill.n_ctx:,} tokens the "
               f"context has.")
        if fill.warn:
            tip += (" The next message may not fit: start a new branch earlier, or load the "
                    "model with a larger context (Settings).")
        self.bar.setToolTip(tip)
        # Red past WARN_AT, in either theme.
        self.bar.setStyleSheet("QProgressBar::chunk { background: #c8553d; }"
                               if fill.warn else "")
