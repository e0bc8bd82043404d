"""Discover: find a GGUF model on Hugging Face, see whether it fits, and download it.

The search box asks the hub (app.state.hub_jobs.HubJobs, off the GUI thread; a new search
cancels the last); empty, it lists the recommended models (resources/recommended-models.json),
which needs no network. A repository shows its GGUF models one row per quantization with the
size, and, once the header of one of them has been read over HTTP ranges (a few hundred KiB,
no weights), the architecture, trained context, chat template and memory kind, and for every
row whether it fits this machine at the context size in Settings with the checkpoint budget:
the header gives the cache's shape, the file size the weights. With a GPU, its memory as the
engine process measured it (the window's process never loads llama.cpp; `free_vram`) takes
the model first and the rest spills to RAM. An unreachable hub is one line above the list;
nothing else changes.

Downloads are the session's (app.state.hub_jobs.Downloads, owned by the window): they go on
when the dialog is closed, and `DownloadsView` lists them with their progress, Cancel and
Resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.state.hub_jobs import Call, DownloadRow, Downloads, HubJobs, HubResult, RowState
from engine.config.params import FlashAttention
from engine.config.settings import Settings
from engine.models.fit import Fit, Verdict, available_ram
from engine.models.hub import HubClient, RepoDetails, RepoSummary, SortOrder, fit_of
from engine.models.quants import QuantGroup
from engine.models.recommended import Recommended, load_recommended
from engine.models.remote_header import RemoteHeader

SEARCH_DELAY_MS = 500  # typing pauses this long before the hub is asked
RECOMMENDED_NOTE = "Recommended models (no search needed; type to search Hugging Face)"
REPO_ROLE = Qt.ItemDataRole.UserRole
_SORTS = (("Most downloaded", SortOrder.DOWNLOADS), ("Trending", SortOrder.TRENDING))
_COLUMNS = ("Quantization", "Size", "Fit", "Architecture", "Trained context", "Memory kind",
            "Chat template")


def gib(n: int | None) -> str:
    if n is None:
        return "size unknown"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def on_gpu(fit: Fit) -> int:
    """What of the model the GPU would hold (the rest spills to RAM)."""
    return min(fit.need.on_device, fit.free_vram or 0)


def fit_text(fit: Fit) -> str:
    where = ""
    if fit.verdict is not Verdict.DOES_NOT_FIT and on_gpu(fit):
        where = " on the GPU" if fit.all_on_gpu else " on the GPU and in RAM"
    if fit.verdict is Verdict.SMALLER_CONTEXT:
        return f"fits{where} with a smaller context ({fit.n_ctx:,})"
    return fit.verdict.value + where


def fit_tooltip(fit: Fit, free_ram: int, gpu_note: str = "") -> str:
    need = fit.need
    text = (f"At a context of {fit.n_ctx:,} tokens it needs {gib(need.total)}: weights "
            f"{gib(need.weights)}, cache {gib(need.cache)}, buffers {gib(need.compute)}, "
            f"checkpoints {gib(need.checkpoints)} (in RAM). ")
    if fit.free_vram is not None:
        gpu = on_gpu(fit)
        text += (f"The GPU can take {gib(fit.free_vram)} (its free memory with the loaded "
                 f"model's share, less the margin llama.cpp keeps): {gib(gpu)} would be on it "
                 f"and {gib(need.on_device - gpu)} would spill to RAM. ")
    return text + f"{gib(free_ram)} of RAM is free.{gpu_note}"


def no_gpu() -> int | None:
    return None


def checkpoint_budget(settings: Settings) -> int:
    from engine.storage.checkpoints import default_ram_budget

    return settings.ram_budget() or default_ram_budget()


@dataclass(frozen=True)
class Shown:
    """The repository on screen and what is known of it."""

    details: RepoDetails
    header: RemoteHeader | None = None


class DiscoverPanel(QWidget):
    """Search, a repository's quantizations with their fit, Download; and the downloads."""

    download_started = Signal(object)  # DownloadRow

    def __init__(self, jobs: HubJobs, downloads: Downloads, settings: Settings,
                 parent: QWidget | None = None, *,
                 free_ram: Callable[[], int] = available_ram,
                 free_vram: Callable[[], int | None] = no_gpu,
                 recommended: list[Recommended] | None = None) -> None:
        super().__init__(parent)
        self.jobs = jobs
        self.downloads = downloads
        self.settings = settings
        self._free_ram = free_ram
        self._free_vram = free_vram  # what a model may take on the GPUs; None: no GPU
        self.recommended = recommended if recommended is not None else load_recommended()
        self._wanted: dict[Call, int] = {}  # the request whose answer is still wanted
        self.shown: Shown | None = None
        self._preferred_quant: str | None = None

        self.search_box = QLineEdit(placeholderText="Search Hugging Face for GGUF models "
                                    "(a name, or owner/name)")
        self.search_box.setClearButtonEnabled(True)
        self.sort_box = QComboBox()
        for label, order in _SORTS:
            self.sort_box.addItem(label, order)
        self.notice = QLabel()  # offline, an error, "searching…"
        self.notice.setObjectName("discover-notice")
        self.notice.setWordWrap(True)
        self.results = QListWidget()
        self.results.setObjectName("discover-results")
        self.results.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.results.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.results.setSpacing(3)
        self.results.setAlternatingRowColors(True)
        self.repo_label = QLabel("Choose a model on the left.")
        self.repo_label.setWordWrap(True)
        self.table = QTableWidget(0, len(_COLUMNS))
        self.table.setHorizontalHeaderLabels(list(_COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.download_button = QPushButton("Download")
        self.download_button.setEnabled(False)
        self.downloads_view = DownloadsView(downloads)

        top = QHBoxLayout()
        top.addWidget(self.search_box, 1)
        top.addWidget(self.sort_box)
        right = QWidget()
        right_column = QVBoxLayout(right)
        right_column.setContentsMargins(0, 0, 0, 0)
        right_column.addWidget(self.repo_label)
        right_column.addWidget(self.table, 1)
        right_column.addWidget(self.download_button, 0, Qt.AlignmentFlag.AlignRight)
        split = QSplitter()
        split.addWidget(self.results)
        split.addWidget(right)
        split.setSizes([300, 700])
        column = QVBoxLayout(self)
        column.addLayout(top)
        column.addWidget(self.notice)
        column.addWidget(split, 3)
        column.addWidget(self.downloads_view, 1)

        self._timer = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._timer.timeout.connect(self.run_search)
        self.search_box.textEdited.connect(lambda _text: self._timer.start())
        self.search_box.returnPressed.connect(self.run_search)
        self.sort_box.currentIndexChanged.connect(self.run_search)
        self.results.currentItemChanged.connect(self._on_result)
        self.table.itemSelectionChanged.connect(self._on_group)
        self.download_button.clicked.connect(self.download_selected)
        jobs.finished.connect(self._on_finished)
        self.show_recommended()

    @Slot()
    def cancel_pending(self) -> None:
        """Stop the requests whose answers this panel waits for (it is closing)."""
        for request in self._wanted.values():
            self.jobs.cancel(request)
        self._wanted.clear()

    # --- search ------------------------------------------------------------------------------

    @Slot()
    def run_search(self) -> None:
        self._timer.stop()
        text = self.search_box.text().strip()
        if not text:
            self.show_recommended()
            return
        self.notice.setText("Searching Hugging Face…")
        self._wanted[Call.SEARCH] = self.jobs.search(text, SortOrder(self.sort_box.currentData()))

    def show_recommended(self) -> None:
        """The recommended list, from the resources: no network needed to list it."""
        self._wanted.pop(Call.SEARCH, None)
        self.notice.setText(RECOMMENDED_NOTE)
        self.results.clear()
        for model in self.recommended:
            size = f"~{model.approx_gb:g} GB" if model.approx_gb else "size on the hub"
            item = QListWidgetItem(f"{model.title} · {model.quant}\n"
                                   f"{model.memory_kind.value.replace('_', ' ')} · {size} · "
                                   f"{model.license}")
            item.setData(REPO_ROLE, (model.repo, model.quant))
            item.setToolTip(model.repo)
            self.results.addItem(item)

    def _show_results(self, found: list[RepoSummary]) -> None:
        self.results.clear()
        self.notice.setText(f"{len(found)} GGUF repositories" if found else
                            "No GGUF repository matches; try fewer words.")
        for repo in found:
            gated = " · gated" if repo.gated else ""
            item = QListWidgetItem(f"{repo.repo}\n{repo.downloads:,} downloads · "
                                   f"{repo.license or 'license not given'}{gated}")
            item.setData(REPO_ROLE, (repo.repo, None))
            item.setToolTip(repo.repo)
            self.results.addItem(item)

    # --- a repository ------------------------------------------------------------------------

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_result(self, item: QListWidgetItem | None, _previous: object) -> None:
        if item is None:
            return
        repo, quant = item.data(REPO_ROLE)
        self.open_repo(repo, quant)

    def open_repo(self, repo: str, quant: str | None = None) -> None:
        """Ask for a repository's files; `quant`: the row to select when they come."""
        for call in (Call.DETAILS, Call.HEADER):
            if call in self._wanted:
                self.jobs.cancel(self._wanted.pop(call))
        self.shown = None
        self._preferred_quant = quant
        self.table.setRowCount(0)
        self.download_button.setEnabled(False)
        self.repo_label.setText(f"{repo}: reading its files…")
        self._wanted[Call.DETAILS] = self.jobs.details(repo)

    def _show_details(self, details: RepoDetails) -> None:
        self.shown = Shown(details)
        gated = (" · gated: accept its terms on its page and set a Hugging Face token in "
                 "Settings" if details.gated else "")
        self.repo_label.setText(f"<b>{details.repo}</b> · license: "
                                f"{details.license or 'not given'}{gated}")
        self.table.setRowCount(len(details.groups))
        for row, group in enumerate(details.groups):
            parts = f" ({len(group.files)} parts)" if group.parts > 1 else ""
            self._set(row, 0, group.quant + parts)
            self._set(row, 1, gib(group.size))
            self._set(row, 2, "reading the header…" if row == 0 else "")
        if not details.groups:
            self.repo_label.setText(f"{details.repo} has no GGUF model file.")
            return
        wanted = self._preferred_quant
        pick = next((r for r, g in enumerate(details.groups)
                     if wanted is not None and g.quant.upper() == wanted.upper()), None)
        if pick is None:
            default = details.group(None) if _has_default(details) else details.groups[0]
            pick = details.groups.index(default)
        self.table.selectRow(pick)

    def selected_group(self) -> QuantGroup | None:
        rows = self.table.selectionModel().selectedRows()
        if self.shown is None or not rows:
            return None
        return self.shown.details.groups[rows[0].row()]

    @Slot()
    def _on_group(self) -> None:
        group = self.selected_group()
        self.download_button.setEnabled(group is not None and group.complete)
        if group is None or self.shown is None:
            return
        self.download_button.setText(f"Download {group.quant} ({gib(group.size)})")
        header = self.shown.header
        if header is None or header.path != group.first.path:
            if Call.HEADER in self._wanted:
                self.jobs.cancel(self._wanted.pop(Call.HEADER))
            self._wanted[Call.HEADER] = self.jobs.header(self.shown.details, group)

    def _show_header(self, header: RemoteHeader) -> None:
        """The header's facts on the rows of this model, and every row's fit: the cache's
        shape is the model's, whatever the quantization; the weights are each file's."""
        if self.shown is None:
            return
        self.shown = Shown(self.shown.details, header)
        summary = header.summary
        budget = checkpoint_budget(self.settings)
        free = self._free_ram()
        vram, gpu_note = self._free_vram(), ""
        if vram is not None and self.settings.n_gpu_layers == 0:
            vram, gpu_note = None, " (GPU layers are 0 in Settings: the GPU is not counted.)"
        for row, group in enumerate(self.shown.details.groups):
            template = "the model's own" if summary.chat_template else "none (built-in)"
            facts = (summary.architecture,
                     f"{summary.context_length:,}" if summary.context_length else "unknown",
                     summary.memory_kind.value.replace("_", " "), template)
            for offset, text in enumerate(facts):
                self._set(row, 3 + offset, text)
            if group.size is None:
                self._set(row, 2, "size unknown")
                continue
            fit = fit_of(header, group.size, self.settings.n_ctx, free_ram=free,
                         checkpoint_budget=budget, free_vram=vram,
                         type_k=self.settings.type_k, type_v=self.settings.type_v,
                         flash_attn=self.settings.flash_attn is FlashAttention.ON)
            cell = self._set(row, 2, fit_text(fit))
            cell.setToolTip(fit_tooltip(fit, free, gpu_note) +
                            f" (Read from its header: {header.bytes_read:,} bytes.)")

    def _set(self, row: int, column: int, text: str) -> QTableWidgetItem:
        item = QTableWidgetItem(text)
        self.table.setItem(row, column, item)
        return item

    def fit_label(self, row: int) -> str:
        item = self.table.item(row, 2)
        return item.text() if item is not None else ""

    # --- downloading -------------------------------------------------------------------------

    @Slot()
    def download_selected(self) -> DownloadRow | None:
        group = self.selected_group()
        if group is None or self.shown is None or not group.complete:
            return None
        details = self.shown.details
        remotes = HubClient(self.jobs.hub()).remote_files(details, group)
        row = self.downloads.add(f"{details.repo}:{group.quant}", remotes)
        self.download_started.emit(row)
        return row

    # --- answers -----------------------------------------------------------------------------

    @Slot(object)
    def _on_finished(self, result: HubResult) -> None:
        if self._wanted.get(result.call) != result.request:
            return  # an answer nobody waits for any more
        del self._wanted[result.call]
        if result.error is not None:
            self._show_error(result)
        elif result.call is Call.SEARCH:
            self._show_results(result.value)
        elif result.call is Call.DETAILS:
            self._show_details(result.value)
        elif result.call is Call.HEADER:
            self._show_header(result.value)

    def _show_error(self, result: HubResult) -> None:
        text = result.error or ""
        if result.offline:
            text = ("Offline: " + text + ". The recommended list below needs no network."
                    if result.call is Call.SEARCH else "Offline: " + text)
            if result.call is Call.SEARCH:
                self.show_recommended()
        self.notice.setText(text)
        if result.call is Call.DETAILS:
            self.repo_label.setText(text)
        elif result.call is Call.HEADER and self.shown is not None:
            for row in range(self.table.rowCount()):
                if self.fit_label(row) == "reading the header…":
                    self._set(row, 2, "unknown (header not read)")


def _has_default(details: RepoDetails) -> bool:
    try:
        details.group(None)
    except Exception:
        return False
    return True


class DownloadsView(QWidget):
    """The session's downloads, one line each: what, a progress bar with the bytes, the speed
    and the time left, and Cancel or Resume."""

    def __init__(self, downloads: Downloads, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.downloads = downloads
        self.title = QLabel("Downloads")
        self.title.setObjectName("downloads-title")
        self._column = QVBoxLayout(self)
        self._column.setContentsMargins(0, 0, 0, 0)
        self._column.addWidget(self.title)
        self._column.addStretch(1)
        self.lines: dict[int, DownloadLine] = {}
        downloads.changed.connect(self._on_changed)
        for row in downloads.rows.values():
            self._on_changed(row)
        self._update_title()

    @Slot(object)
    def _on_changed(self, row: DownloadRow) -> None:
        line = self.lines.get(row.row)
        if row.row not in self.downloads.rows:
            self._update_title()
            return
        if line is None:
            line = DownloadLine(self.downloads, row.row)
            self.lines[row.row] = line
            self._column.insertWidget(self._column.count() - 1, line)
        line.show_row(row)
        self._update_title()

    def _update_title(self) -> None:
        for number in [n for n in self.lines if n not in self.downloads.rows]:
            self.lines.pop(number).deleteLater()  # discarded
        self.title.setVisible(bool(self.lines))


class DownloadLine(QWidget):
    def __init__(self, downloads: Downloads, row: int) -> None:
        super().__init__()
        self.downloads = downloads
        self.row = row
        self.label = QLabel()
        self.label.setMinimumWidth(200)
        self.bar = QProgressBar()
        self.bar.setTextVisible(True)
        self.cancel_button = QPushButton("Cancel")
        self.resume_button = QPushButton("Resume")
        self.discard_button = QPushButton("Discard")
        line = QHBoxLayout(self)
        line.setContentsMargins(0, 0, 0, 0)
        line.addWidget(self.label, 2)
        line.addWidget(self.bar, 3)
        for button in (self.cancel_button, self.resume_button, self.discard_button):
            line.addWidget(button)
        self.cancel_button.clicked.connect(lambda: downloads.cancel(row))
        self.resume_button.clicked.connect(lambda: downloads.resume(row))
        self.discard_button.clicked.connect(lambda: downloads.discard(row))

    def show_row(self, row: DownloadRow) -> None:
        self.label.setText(row.title)
        self.label.setToolTip(row.error or row.title)
        total = row.total_bytes
        self.bar.setRange(0, 1000)
        self.bar.setValue(int(1000 * row.done_bytes / total) if total else 0)
        self.bar.setFormat(progress_text(row))
        self.bar.setToolTip(row.error or progress_text(row))
        running = row.state in (RowState.QUEUED, RowState.RUNNING)
        self.cancel_button.setVisible(running)
        self.resume_button.setVisible(row.state.resumable)
        self.discard_button.setVisible(row.state is RowState.UNFINISHED)


def progress_text(row: DownloadRow) -> str:
    """"1.2 of 3.4 GiB · 5.1 MiB/s · 2 min left", or the state in words."""
    total = row.total_bytes
    amount = f"{gib(row.done_bytes)} of {gib(total)}" if total else gib(row.done_bytes)
    if row.state is RowState.RUNNING:
        p = row.progress
        if p is None:
            return f"{amount} · starting"
        speed = f" · {p.bytes_per_second / 2**20:.1f} MiB/s" if p.bytes_per_second else ""
        left = f" · {_duration(p.seconds_left)} left" if p.seconds_left is not None else ""
        return f"{amount}{speed}{left}"
    if row.state is RowState.DONE:
        return f"done · {gib(row.done_bytes)}"
    if row.state is RowState.FAILED:
        return f"failed: {row.error}"
    if row.state is RowState.CANCELLED:
        return f"cancelled at {amount} (kept: Resume goes on)"
    if row.state is RowState.UNFINISHED:
        return f"unfinished from last time: {amount}"
    return f"queued · {amount}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
