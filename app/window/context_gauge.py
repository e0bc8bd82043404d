"""How full the context is: the active branch's tokens against the model's context size.

Arbor knows the exact tokens of every node it has rendered; a node not rendered yet (a
message just typed, a branch never prepared) is estimated from its text and the gauge says
"about". Past WARN_AT of the context the gauge warns that the next message may not fit;
when the conversation leaves its oldest messages out instead (engine.core.overflow), the gauge
shows what the next reply reads and how many messages it leaves out."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import QProgressBar

from app.state.controller import ChatController
from engine.core.attachments import documents_of, message_content
from engine.core.overflow import Overflow, fit, reply_room
from engine.core.tree import Node, Role

WARN_AT = 0.85
CHARS_PER_TOKEN = 3  # for text not rendered yet: an over-estimate on English, on purpose
MAX_WIDTH = 300
TEXT_PADDING = 24  # the style's frame and margins around the bar's text


@dataclass(frozen=True)
class Fill:
    tokens: int  # what the model reads of the branch
    n_ctx: int
    exact: bool  # every node of the branch has its tokens
    dropped: int = 0  # oldest messages left out (Overflow.DROP_OLDEST)
    total: int = 0  # the whole branch's tokens, read or not
    policy: Overflow = Overflow.STOP
    room: int = 0  # kept free for the reply when messages are left out

    @property
    def near(self) -> bool:
        return self.tokens >= WARN_AT * self.n_ctx

    @property
    def warn(self) -> bool:
        """The next message may not fit: under STOP, past WARN_AT; when the oldest are left
        out, only if even that leaves no room for a reply (one huge message)."""
        if self.policy is Overflow.STOP:
            return self.near
        return self.tokens + self.room > self.n_ctx

    @property
    def dropping(self) -> bool:
        return self.dropped > 0


def branch_fill(path: list[Node], n_ctx: int, *, overflow: Overflow = Overflow.STOP,
                max_tokens: int = 512) -> Fill:
    """How much of the context the branch `path` takes, as the next reply will read it
    (engine.core.overflow: the same cut the engine makes, on the nodes' own tokens)."""
    lengths: list[int] = []
    exact = True
    for node in path:
        if node.tokens is not None:
            lengths.append(len(node.tokens))
        else:
            exact = False
            shown = message_content(node.text, documents_of(node.meta))  # its documents too
            lengths.append(-(-len(shown) // CHARS_PER_TOKEN))
    room = reply_room(n_ctx, max_tokens)
    cut = fit(lengths, [node.role is Role.USER for node in path], tail=0, n_ctx=n_ctx,
              room=room, policy=overflow)
    return Fill(cut.tokens, n_ctx, exact, cut.dropped, sum(lengths), overflow, room)


class ContextGauge(QObject):
    def __init__(self, controller: ChatController, bar: QProgressBar) -> None:
        super().__init__(bar)
        self.controller = controller
        self.bar = bar
        bar.setObjectName("context-gauge")
        bar.setMaximumWidth(MAX_WIDTH)
        bar.setTextVisible(True)
        self.fill: Fill | None = None
        replies = controller.replies
        for signal in (controller.changed, replies.model_changed, replies.reply_finished,
                       replies.warmed):
            signal.connect(self.update)
        self.update()

    def document_room(self) -> int | None:
        """The characters of documents the next message has room for: the context less the
        branch and the reply's room, at CHARS_PER_TOKEN (an over-estimate of tokens); None
        with no model loaded."""
        fill = self.fill
        if fill is None:
            return None
        free = fill.n_ctx - fill.tokens - max(fill.room, 256)
        return max(0, free) * CHARS_PER_TOKEN

    @Slot()
    def update(self, *_args: object) -> None:
        model = self.controller.replies.model
        if model is None or self.controller.current is None:
            self.fill = None
            self.bar.setVisible(False)
            return
        settings = self.controller.overrides().apply(self.controller.settings)
        fill = branch_fill(self.controller.tree.active_path(), model.n_ctx,
                           overflow=settings.overflow, max_tokens=settings.max_tokens)
        self.fill = fill
        self.bar.setVisible(True)
        self.bar.setRange(0, fill.n_ctx)
        self.bar.setValue(min(fill.tokens, fill.n_ctx))
        about = "" if fill.exact else "about "
        self.bar.setFormat(f"context {about}{fill.tokens:,} / {fill.n_ctx:,}")
        tip = (f"This branch holds {about}{fill.tokens:,} of the {fill.n_ctx:,} tokens the "
               f"context has.")
        if fill.dropping:
            left = f"{fill.dropped} earlier message{'s' * (fill.dropped != 1)}"
            self.bar.setFormat(f"context {about}{fill.tokens:,} / {fill.n_ctx:,} · "
                               f"{fill.dropped} left out")
            tip = (f"The branch is {about}{fill.total:,} tokens, more than the {fill.n_ctx:,} "
                   f"the context has: the model reads the system prompt and the newest "
                   f"{about}{fill.tokens:,} tokens, and leaves the {left} before them out "
                   f"(they stay in the conversation). Conversation settings choose this.")
        if fill.warn:
            tip += (" The next message may not fit: start a new branch earlier, or load the "
                    "model with a larger context (Settings).")
            if fill.policy is Overflow.STOP:
                tip += " Or let the oldest messages be left out (Conversation settings)."
        elif fill.near and not fill.dropping:
            tip += " The next replies will leave the oldest messages out."
        self.bar.setToolTip(tip)
        # Wide enough for its text: a narrow window squeezed the bar until the text ran out
        # of it ("2 left|out").
        room = self.bar.fontMetrics().horizontalAdvance(self.bar.text()) + TEXT_PADDING
        self.bar.setMinimumWidth(room)
        self.bar.setMaximumWidth(max(MAX_WIDTH, room))
        # Red past WARN_AT, in either theme.
        self.bar.setStyleSheet("QProgressBar::chunk { background: #c8553d; }"
                               if fill.warn else "")
