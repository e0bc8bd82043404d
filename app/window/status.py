"""Every line of text about what the engine is doing, in one place.

Above the composer: a progress bar and a line (loading, preparing a prompt with what is
reused and the time left, tokens per second while a reply streams, "ready" after a warm-up).
In the status bar: the model, its memory kind, the backend, the checkpoint store's use against
its budget, and passing messages (the last step's figures stay until the next one).
"""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar

from app.look.elided_label import ElidedLabel
from app.look.model_names import display_name
from app.state.replies import Replies
from engine.core.results import ReplyReport


class StatusArea(QObject):
    def __init__(self, replies: Replies, status_bar: QStatusBar) -> None:
        super().__init__(replies)
        self.replies = replies
        self.bar = status_bar
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.label = QLabel()  # the line above the composer
        # Cut with "…" when the window is narrow, never pushed off the bar's left edge.
        self.model_label = ElidedLabel("Loading the model…")
        self.store_label = ElidedLabel()
        self.api_label = QLabel()  # the local API's address, while it serves
        self.api_label.setVisible(False)
        status_bar.addPermanentWidget(self.api_label)
        status_bar.addPermanentWidget(self.store_label)
        status_bar.addPermanentWidget(self.model_label)
        replies.loading.connect(self._on_loading)
        replies.load_progress.connect(self._on_load_progress)
        replies.model_changed.connect(self._show_model)
        replies.model_ready.connect(self._on_model_ready)
        replies.model_failed.connect(self._on_model_failed)
        replies.template_changed.connect(self._on_template_changed)
        replies.preparing.connect(self._on_preparing)
        replies.answering_rate.connect(self._on_rate)
        replies.report.connect(self._on_report)
        replies.reply_finished.connect(self._on_reply_finished)
        replies.reply_stopped.connect(self._on_reply_stopped)
        replies.ready.connect(self._on_ready)

    def message(self, text: str, timeout_ms: int = 0) -> None:
        self.bar.showMessage(text, timeout_ms)

    def show_api(self, url: str | None, problem: str | None) -> None:
        """The local API: its address while it serves, or why it could not start."""
        if problem is not None:
            self.api_label.setText(f"API off: {problem}")
            self.message(f"The local API server could not start: {problem}.", 12_000)
        else:
            self.api_label.setText(f"API: {url}" if url else "")
        self.api_label.setToolTip("OpenAI-compatible: point a client's base URL here "
                                  "(Settings > Local API server)")
        self.api_label.setVisible(bool(url) or problem is not None)

    # --- loading -----------------------------------------------------------------------------

    @Slot(str)
    def _on_loading(self, path: str) -> None:
        self.show_busy(f"Loading {Path(path).name}…")
        self.model_label.setText(f"Loading {display_name(Path(path).name)}…")

    def show_busy(self, text: str) -> None:
        if self.replies.streaming is not None:
            return
        self.label.setText(text)
        self.progress.setVisible(True)
        self.progress.setMaximum(0)  # busy until the loader reports progress

    def _hide_busy(self) -> None:
        if self.replies.streaming is None:
            self.progress.setVisible(False)
            self.label.clear()

    @Slot(float)
    def _on_load_progress(self, fraction: float) -> None:
        if self.replies.streaming is not None:
            return
        self.progress.setVisible(True)
        self.progress.setMaximum(1000)
        self.progress.setValue(int(fraction * 1000))
        self.progress.setFormat(f"{fraction * 100:.0f}%")

    @Slot()
    def _on_model_ready(self) -> None:
        self._hide_busy()
        model = self.replies.model
        if model is not None and model.notices:
            self.message(" · ".join(model.notices), 15_000)

    @Slot(str)
    def _on_model_failed(self, _message: str) -> None:
        self._hide_busy()
        self._show_model()

    @Slot(str)
    def _on_template_changed(self, description: str) -> None:
        self.message(f"Chat template for new messages: {description}", 10_000)

    @Slot()
    def _show_model(self) -> None:
        model, usage = self.replies.model, self.replies.usage
        if model is not None:
            name = display_name(Path(model.path).name, model.name)
            self.model_label.setText(f"{name} · {model.memory_kind.replace('_', ' ')} · "
                                     f"{model.backend} · ctx {model.n_ctx}")
            self.model_label.setToolTip(f"{model.name}\n{model.path}\n"
                                        f"Chat template: {model.template}")
        if usage is not None:
            self.store_label.setText(
                f"checkpoints: {usage.count} · RAM {usage.ram_bytes / 2**20:.0f} of "
                f"{usage.ram_budget / 2**20:.0f} MiB · disk {usage.disk_bytes / 2**20:.0f} MiB")

    # --- a reply -----------------------------------------------------------------------------

    @Slot(int, int, str)
    def _on_preparing(self, done: int, total: int, plan: str) -> None:
        total = max(1, total)
        elapsed = time.monotonic() - self.replies.prepare_started
        eta = elapsed / done * (total - done) if done else 0.0
        self.progress.setVisible(done < total)
        self.progress.setMaximum(total)
        self.progress.setValue(done)
        self.progress.setFormat(f"{100 * done // total}% · about {eta:.0f} s left")
        self.label.setText(plan)

    @Slot(float)
    def _on_rate(self, rate: float) -> None:
        self.progress.setVisible(False)
        self.label.setText(f"Answering… {rate:.1f} tokens/s")

    @Slot(object)
    def _on_report(self, report: ReplyReport) -> None:
        self.message(report.describe())

    @Slot()
    def _on_reply_finished(self) -> None:
        self.progress.setVisible(False)
        self.label.clear()

    @Slot()
    def _on_reply_stopped(self) -> None:
        self.message("Stopped.", 4000)  # a failure gets a message box of its own

    @Slot(int)
    def _on_ready(self, prompt_tokens: int) -> None:
        """After a warm-up of the current conversation (0: a new one started). On the line
        above the composer: the status bar keeps the last step's figures."""
        if self.replies.streaming is not None or not self.progress.isHidden():
            return
        if prompt_tokens:
            self.label.setText(f"Ready: {prompt_tokens:,} tokens prepared; the next message "
                               "decodes only itself.")
        else:
            self.label.clear()
