"""The model picker: the bundled default, the models folder, and any GGUF file.

Each row shows what the GGUF header says (name, architecture, file size, trained context
length, memory kind, chat template) without loading the weights; a file whose header cannot be
read is listed with the reason and cannot be chosen. The chat template can be chosen per model
file: automatic (the file's own, else llama.cpp's built-in one for the architecture) or any
template llama.cpp knows by name. Models are named as people know them (app.look.model_names);
the header's own name is in the tooltip.

Given the session's hub jobs and downloads, the picker has a second tab, Discover
(app.dialogs.discover): a model downloaded there appears in the first tab, selected, ready to
load.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QPersistentModelIndex,
    Qt,
    QUrl,
)
from PySide6.QtGui import QDesktopServices, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.dialogs.discover import DiscoverPanel, no_gpu
from app.look.model_names import display_name
from app.state.hub_jobs import Downloads, HubJobs
from engine.config.settings import Settings
from engine.core.errors import ArborError
from engine.core.templates import MODEL_TEMPLATE, TemplateChoice, choose_template, template_options
from engine.files.paths import data_dirs
from engine.models.files import ModelInfo, list_models, read_model_info

TEMPLATE_NOTE = (
    "A template applies to messages the model has not read yet. Messages it has read keep "
    "the tokens they were first rendered to, so existing conversations go on exactly as "
    "they were."
)

ModelIndex = QModelIndex | QPersistentModelIndex


@dataclass(frozen=True)
class ModelEntry:
    path: Path
    info: ModelInfo | None
    problem: str | None  # why the header could not be read
    size_bytes: int | None  # None: the file could not be read at all

    @staticmethod
    def read(path: Path) -> ModelEntry:
        """Read once, when listed: the table's cells are asked for on every repaint."""
        try:
            info = read_model_info(path)
            return ModelEntry(path, info, None, info.size_bytes)
        except ArborError as exc:
            try:
                size: int | None = path.stat().st_size
            except OSError:
                size = None
            return ModelEntry(path, None, str(exc), size)


class Column(IntEnum):
    NAME = 0
    ARCHITECTURE = 1
    SIZE = 2
    CONTEXT = 3
    MEMORY = 4
    TEMPLATE = 5
    FILE = 6


_HEADERS = ("Name", "Architecture", "Size", "Context", "Memory kind", "Chat template", "File")


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


TemplateFn = Callable[[ModelEntry], TemplateChoice | None]


class ModelListModel(QAbstractTableModel):
    def __init__(self, entries: Sequence[ModelEntry] = (), loaded: str | None = None,
                 template: TemplateFn | None = None) -> None:
        super().__init__()
        self._entries = list(entries)
        self._loaded = loaded
        self._template = template or (lambda _entry: None)

    def rowCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._entries)

    def columnCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(Column)

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if (orientation is Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole
                and 0 <= section < len(_HEADERS)):
            return _HEADERS[section]
        return None

    def flags(self, index: ModelIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        if self._entries[index.row()].info is None:
            return Qt.ItemFlag.ItemIsEnabled  # listed, not choosable
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable

    def data(self, index: ModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._entries):
            return None
        entry = self._entries[index.row()]
        column = Column(index.column())
        if role == Qt.ItemDataRole.DisplayRole:
            if column is Column.TEMPLATE:
                choice = self._template(entry) if entry.info is not None else None
                return choice.short() if choice is not None else ""
            return _cell(entry, column)
        if role == Qt.ItemDataRole.ToolTipRole:
            if column is Column.TEMPLATE and entry.info is not None:
                choice = self._template(entry)
                return f"Chat template: {choice.describe()}" if choice is not None else None
            if entry.info is not None and column is Column.NAME:
                return f"{entry.info.name}\n{entry.path}"
            return entry.problem or str(entry.path)
        if role == Qt.ItemDataRole.FontRole and str(entry.path) == self._loaded:
            font = QFont()
            font.setBold(True)
            return font
        if role == Qt.ItemDataRole.UserRole:
            return str(entry.path)
        return None

    def entry(self, row: int) -> ModelEntry:
        return self._entries[row]

    def add(self, entry: ModelEntry) -> int:
        """Add a file (or find it); returns its row."""
        for row, known in enumerate(self._entries):
            if known.path == entry.path:
                return row
        row = len(self._entries)
        self.beginInsertRows(QModelIndex(), row, row)
        self._entries.append(entry)
        self.endInsertRows()
        return row

    def template_changed(self, row: int) -> None:
        cell = self.index(row, Column.TEMPLATE)
        self.dataChanged.emit(cell, cell, [Qt.ItemDataRole.DisplayRole])


def _cell(entry: ModelEntry, column: Column) -> str:
    info = entry.info
    if column is Column.FILE:
        return entry.path.name
    if column is Column.SIZE:
        return human_size(entry.size_bytes) if entry.size_bytes is not None else "—"
    if info is None:
        return f"cannot be used: {entry.problem}" if column is Column.NAME else ""
    if column is Column.NAME:
        return display_name(entry.path.name, info.name)
    if column is Column.ARCHITECTURE:
        return info.architecture
    if column is Column.CONTEXT:
        return f"{info.context_length:,}" if info.context_length else "unknown"
    kind = info.memory_kind.value.replace("_", " ")
    return f"{kind} ({info.sliding_window:,})" if info.sliding_window else kind


class ModelPicker(QDialog):
    """Choose a model and its chat template; `chosen()` is its path and `chosen_template()`
    the template (None: automatic) once the dialog is accepted."""

    def __init__(self, loaded: str | None = None, parent: QWidget | None = None,
                 paths: Sequence[Path] | None = None, *, settings: Settings | None = None,
                 builtin: Sequence[str] | None = None, jobs: HubJobs | None = None,
                 downloads: Downloads | None = None,
                 free_vram: Callable[[], int | None] = no_gpu) -> None:
        """`free_vram`: what a model may take on the GPUs, as the engine measured (Discover)."""
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(1060, 400)
        settings = settings or Settings()
        if builtin is None:
            from engine.llm.llama import builtin_template_names  # the names llama.cpp knows

            builtin = builtin_template_names()
        self._builtin = list(builtin)
        # The template picked per file in this dialog; files not here keep their setting.
        self._templates: dict[Path, str | None] = {}
        self._settings = settings
        found = list(paths) if paths is not None else list_models(data_dirs())
        self.model = ModelListModel([ModelEntry.read(p) for p in found], loaded,
                                    self._template_of)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # A long name or a broken file's reason must not push the other columns away: the
        # name column has a fixed, resizable width (elided; the tooltip has the whole text).
        header.setSectionResizeMode(Column.NAME, QHeaderView.ResizeMode.Interactive)
        header.resizeSection(Column.NAME, 300)
        header.setStretchLastSection(True)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.table.setWordWrap(False)
        self.table.doubleClicked.connect(self._on_double_click)
        folder = data_dirs().models
        hint = QLabel(f"Put GGUF files in <a href='{QUrl.fromLocalFile(str(folder)).toString()}'>"
                      f"{folder}</a> to list them here.")
        hint.setTextFormat(Qt.TextFormat.RichText)
        hint.linkActivated.connect(self._open_folder)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Cancel
        )
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.buttons.addButton(self.load_button, QDialogButtonBox.ButtonRole.AcceptRole)
        browse = QPushButton("Open GGUF file…")
        self.buttons.addButton(browse, QDialogButtonBox.ButtonRole.ActionRole)
        browse.clicked.connect(self._browse)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.template_box = QComboBox()
        self.template_box.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.template_box.setMinimumContentsLength(40)
        self.template_box.currentIndexChanged.connect(self._on_template_picked)
        template_row = QHBoxLayout()
        template_row.addWidget(QLabel("Chat template:"))
        template_row.addWidget(self.template_box, 1)
        note = QLabel(TEMPLATE_NOTE)
        note.setWordWrap(True)
        local = QWidget()
        column = QVBoxLayout(local)
        column.addWidget(self.table)
        column.addLayout(template_row)
        column.addWidget(note)
        column.addWidget(hint)
        outer = QVBoxLayout(self)
        self.tabs = QTabWidget()
        self.tabs.addTab(local, "On this computer")
        self.discover: DiscoverPanel | None = None
        if jobs is not None and downloads is not None:
            self.resize(1060, 640)
            self.discover = DiscoverPanel(jobs, downloads, settings, free_vram=free_vram)
            self.tabs.addTab(self.discover, "Discover")
            downloads.model_downloaded.connect(self._on_downloaded)
            self.finished.connect(self.discover.cancel_pending)
        else:
            self.tabs.tabBar().hide()
        outer.addWidget(self.tabs)
        outer.addWidget(self.buttons)
        self.table.selectionModel().selectionChanged.connect(self._update)
        for row in range(self.model.rowCount()):
            if self.model.entry(row).info is not None:
                self.select_row(row)
                break
        self._update()

    def select_row(self, row: int) -> None:
        self.table.selectRow(row)

    def chosen(self) -> Path | None:
        entry = self._selected()
        return entry.path if entry is not None and entry.info is not None else None

    def chosen_template(self) -> str | None:
        """The template picked for the chosen model: a name, or None for automatic."""
        entry = self._selected()
        return self._picked(entry) if entry is not None else None

    def _selected(self) -> ModelEntry | None:
        rows = self.table.selectionModel().selectedRows()
        return self.model.entry(rows[0].row()) if rows else None

    def _picked(self, entry: ModelEntry) -> str | None:
        if entry.path in self._templates:
            return self._templates[entry.path]
        return self._settings.template_for(entry.path)

    def _template_of(self, entry: ModelEntry, *, automatic: bool = False) -> TemplateChoice | None:
        """The template that applies to a file: as picked, or (`automatic`) without a pick."""
        if entry.info is None:
            return None
        return choose_template(
            embedded=entry.info.chat_template, architecture=entry.info.architecture,
            chosen=None if automatic else self._picked(entry), builtin=self._builtin,
        )

    def _fill_templates(self) -> None:
        """The selected model's choices: automatic first, then every template it can use."""
        entry = self._selected()
        box = self.template_box
        box.blockSignals(True)
        box.clear()
        automatic = self._template_of(entry, automatic=True) if entry is not None else None
        if entry is not None and entry.info is not None and automatic is not None:
            box.addItem(f"Automatic: {automatic.describe()}", None)
            for name in template_options(entry.info.chat_template, self._builtin):
                box.addItem("the model's own" if name == MODEL_TEMPLATE else name, name)
            picked = self._picked(entry)
            box.setCurrentIndex(max(0, box.findData(picked)) if picked is not None else 0)
        box.setEnabled(entry is not None and entry.info is not None)
        box.blockSignals(False)

    def _on_template_picked(self, index: int) -> None:
        rows = self.table.selectionModel().selectedRows()
        if not rows or index < 0:
            return
        entry = self.model.entry(rows[0].row())
        self._templates[entry.path] = self.template_box.itemData(index)
        self.model.template_changed(rows[0].row())

    def add_file(self, path: Path) -> None:
        row = self.model.add(ModelEntry.read(path))
        self.select_row(row)
        self._update()

    def _on_downloaded(self, path: Path) -> None:
        """A download finished: list it, selected, on the first tab, ready to load."""
        self.add_file(path)
        self.tabs.setCurrentIndex(0)

    def _update(self) -> None:
        self.load_button.setEnabled(self.chosen() is not None)
        self._fill_templates()

    def _on_double_click(self, index: QModelIndex) -> None:
        if self.model.entry(index.row()).info is not None:
            self.select_row(index.row())
            self.accept()

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open GGUF model", str(data_dirs().models),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.add_file(Path(path))

    @staticmethod
    def _open_folder(url: str) -> None:
        data_dirs().models.mkdir(parents=True, exist_ok=True)
        QDesktopServices.openUrl(QUrl(url))
