"""The session's downloads in the status bar: one button that says how far they are ("↓ 2
downloads · 45% · 3 min left") while the user chats, offers the parts an earlier run left
unfinished, and opens Discover (where each download has its Cancel and Resume) when clicked.
A finished model is announced with how to load it."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QPushButton, QStatusBar

from app.dialogs.discover import gib
from app.look.model_names import display_name
from app.state.hub_jobs import DownloadRow, Downloads, RowState
from app.window.status import StatusArea


class DownloadsStatus(QObject):
    open_requested = Signal()  # the user wants to see the downloads (Discover)

    def __init__(self, downloads: Downloads, status: StatusArea, bar: QStatusBar) -> None:
        super().__init__(bar)
        self.downloads = downloads
        self.status = status
        self.button = QPushButton()
        self.button.setObjectName("downloads-button")
        self.button.setFlat(True)
        self.button.setVisible(False)
        bar.addPermanentWidget(self.button)
        self.button.clicked.connect(self.open_requested)
        downloads.changed.connect(self._on_changed)
        downloads.model_downloaded.connect(self._on_downloaded)

    def offer_unfinished(self) -> list[DownloadRow]:
        """At start: the parts left by the last run, offered for Resume."""
        found = self.downloads.find_unfinished()
        self.update()
        return found

    @Slot(object)
    def _on_changed(self, _row: DownloadRow) -> None:
        self.update()

    @Slot(object)
    def _on_downloaded(self, path: Path) -> None:
        self.status.message(f"Downloaded {display_name(path.name)}: choose it in Models "
                            "(Ctrl+M) to load it.", 20_000)

    def update(self) -> None:
        rows = list(self.downloads.rows.values())
        active = [r for r in rows if r.state in (RowState.QUEUED, RowState.RUNNING)]
        waiting = [r for r in rows if r.state.resumable]
        if active:
            done = sum(r.done_bytes for r in active)
            totals = [r.total_bytes for r in active]
            total = sum(t or 0 for t in totals)
            share = f" · {100 * done // total}%" if total and None not in totals else ""
            left = [r.progress.seconds_left for r in active
                    if r.progress is not None and r.progress.seconds_left is not None]
            eta = f" · {max(left) / 60:.0f} min left" if left and max(left) >= 90 else (
                f" · {max(left):.0f} s left" if left else "")
            count = f"{len(active)} downloads" if len(active) > 1 else "downloading"
            self.button.setText(f"↓ {count}{share}{eta}")
            self.button.setToolTip("\n".join(f"{r.title}: {gib(r.done_bytes)}" for r in active))
        elif waiting:
            noun = "download" if len(waiting) == 1 else "downloads"
            self.button.setText(f"Resume {len(waiting)} unfinished {noun}…")
            self.button.setToolTip("\n".join(r.title for r in waiting))
        self.button.setVisible(bool(active or waiting))
