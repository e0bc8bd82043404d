"""Settings: the engine's context and offload, the checkpoint store, sampling, the MCP servers
whose tools conversations may offer, the local API server, the Hugging Face token, appearance.

Each of these is a page, chosen in a list on the left (arrow keys there; Ctrl+PgDown and
Ctrl+PgUp, or Ctrl+Tab and Ctrl+Shift+Tab, from anywhere in the dialog); a page scrolls when
the screen is too short for it, so the dialog fits a 1280x720 screen.

The dialog edits a copy; the owner saves and applies what `chosen()` returns. While the user
edits, a line under the pages says what applying will cost: nothing, a reload of the model, or
a reload that leaves the saved checkpoints unusable (so the next reply in every conversation
reads it from the start), or why the form cannot be applied, whichever page is shown.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QKeySequence, QShortcut, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QScrollArea,
    QSpinBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.dialogs.conversation_settings import OVERFLOW_TIP
from app.dialogs.hub_token import TokenBox
from app.dialogs.mcp_servers import McpServersBox
from app.dialogs.samplers import SAMPLERS, editor_values, sampler_editor
from engine.config.params import GPU_LAYERS_FIT, KV_TYPE_NAMES, FlashAttention
from engine.config.settings import MAX_GPU_LAYERS, Effect, Settings, SettingsError, Theme, effect_of
from engine.core.overflow import Overflow

_EFFECT_TEXT = {
    Effect.NONE: "",
    Effect.LIVE: "Applied at once.",
    Effect.RELOAD: "Applying loads the model again; saved checkpoints stay valid.",
    Effect.INVALIDATE: (
        "Applying loads the model again with a new context, and the saved checkpoints do not "
        "fit it: the next reply in each conversation reads it from the start. (They are kept "
        "on disk and serve again if you change these settings back.)"
    ),
}


class SettingsDialog(QDialog):
    def __init__(self, current: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self._current = current
        self._error: str | None = None

        self.n_ctx = _spin(256, 1 << 20, current.n_ctx, " tokens", step=1024)
        self.n_gpu_layers = _spin(GPU_LAYERS_FIT, MAX_GPU_LAYERS, current.n_gpu_layers, "")
        self.n_gpu_layers.setSpecialValueText("all that fit")  # the minimum, GPU_LAYERS_FIT
        self.n_gpu_layers.setToolTip(
            "All that fit: as many layers as the GPU's free memory holds, as llama.cpp fits "
            "them (none without a GPU). -1 offloads every layer; 0 runs on the CPU only. "
            "Without a GPU build, Arbor falls back to the CPU and says so.")
        self.n_threads = _spin(0, 512, current.n_threads, "")
        self.n_threads.setSpecialValueText("automatic")
        self.n_threads.setToolTip("Automatic: the physical cores less one, which wins when "
                                  "anything else is running; all cores win only on an idle "
                                  "machine.")
        self.flash_attn = QComboBox()
        for mode in FlashAttention:
            self.flash_attn.addItem(mode.value, mode)
        self.flash_attn.setCurrentIndex(list(FlashAttention).index(current.flash_attn))
        self.type_k = _kv_box(current.type_k)
        self.type_v = _kv_box(current.type_v)
        self.rpc_workers = QLineEdit(", ".join(current.rpc_workers))
        self.rpc_workers.setPlaceholderText("none: host:port, host:port")
        self.rpc_workers.setToolTip(
            "Other machines running `arbor-engine rpc-worker` take the model's layers. The "
            "protocol has no authentication: trusted networks or an SSH tunnel only.")

        self.ram_budget = _spin(0, 1 << 20, current.checkpoint_ram_mib, " MiB", step=256)
        self.ram_budget.setSpecialValueText("automatic (an eighth of RAM)")
        self.disk_tier = QCheckBox("Spill checkpoints to disk and keep them across restarts")
        self.disk_tier.setChecked(current.disk_tier)
        self.interval = _spin(64, 1 << 20, current.checkpoint_interval, " tokens", step=512)

        self.temperature = QDoubleSpinBox(decimals=2, minimum=0.0, maximum=5.0, singleStep=0.05)
        self.temperature.setValue(current.temperature)
        self.temperature.setSpecialValueText("0 (greedy)")
        self.top_p = QDoubleSpinBox(decimals=2, minimum=0.01, maximum=1.0, singleStep=0.05)
        self.top_p.setValue(current.top_p)
        self.samplers = {f.name: sampler_editor(f, getattr(current, f.name)) for f in SAMPLERS}
        self.seed = _spin(-1, 0x7FFFFFFF, -1 if current.seed is None else current.seed, "")
        self.seed.setSpecialValueText("a new one for every reply")
        self.max_tokens = _spin(1, 1 << 16, current.max_tokens, " tokens", step=128)
        self.overflow = QComboBox()
        for policy in Overflow:
            self.overflow.addItem(policy.label, policy)
        self.overflow.setCurrentIndex(list(Overflow).index(current.overflow))
        self.overflow.setToolTip(OVERFLOW_TIP)

        self.api_server = QCheckBox("Serve the loaded model to other programs on this computer")
        self.api_server.setChecked(current.api_server)
        self.api_server.setToolTip("An OpenAI-compatible API at http://127.0.0.1:PORT/v1 "
                                   "(SillyTavern, Open WebUI, editors); its conversations "
                                   "appear in the sidebar")
        self.api_port = _spin(1, 65535, current.api_port, "")
        self.api_key = QLineEdit(current.api_key)
        self.api_key.setPlaceholderText("none (any program on this computer may connect)")

        self.theme = QComboBox()
        for theme in Theme:
            self.theme.addItem(theme.value.capitalize(), theme)
        self.theme.setCurrentIndex(list(Theme).index(current.theme))

        engine = QFormLayout()
        engine.addRow("Context size", self.n_ctx)
        engine.addRow("GPU layers", self.n_gpu_layers)
        engine.addRow("Threads", self.n_threads)
        engine.addRow("Flash attention", self.flash_attn)
        engine.addRow("K cache type", self.type_k)
        engine.addRow("V cache type", self.type_v)
        engine.addRow("Remote workers (llama.cpp RPC)", self.rpc_workers)
        checkpoints = QFormLayout()
        checkpoints.addRow("RAM budget", self.ram_budget)
        checkpoints.addRow("Disk tier", self.disk_tier)
        checkpoints.addRow("Interval", self.interval)
        sampling = QFormLayout()
        sampling.addRow("Temperature", self.temperature)
        sampling.addRow("Top-p", self.top_p)
        for field in SAMPLERS:
            sampling.addRow(field.label, self.samplers[field.name])
        sampling.addRow("Seed", self.seed)
        sampling.addRow("Longest reply", self.max_tokens)
        sampling.addRow("When the context is full", self.overflow)
        api = QFormLayout()
        api.addRow("Local API", self.api_server)
        api.addRow("Port", self.api_port)
        api.addRow("API key", self.api_key)
        look = QFormLayout()
        look.addRow("Theme", self.theme)

        self.effect_label = QLabel(wordWrap=True)
        self.effect_label.setObjectName("settings-effect")
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

        self.mcp = McpServersBox(current.mcp_servers)
        self.mcp.changed.connect(self._update)
        self.token = TokenBox()  # saved by the owner on accept (ModelSettings)
        self.token.field.textChanged.connect(self._update)

        # The pages, in the list's order: a box each.
        self.sections = QListWidget()
        self.sections.setObjectName("settings-sections")
        self.sections.setAccessibleName("Settings pages")
        self.sections.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.sections.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.pages = QStackedWidget()
        self.pages.setObjectName("settings-pages")
        replies = "Replies (defaults: Ctrl+Shift+, gives a conversation its own)"
        for name, page in (("Model", _box("Model and context", engine)),
                           ("Checkpoints", _box("Checkpoints", checkpoints)),
                           ("Replies", _box(replies, sampling)),
                           ("Tools", self.mcp),  # its list takes the page's height
                           ("Local API", _box("Local API server", api)),
                           ("Hugging Face", self.token),
                           ("Appearance", _box("Appearance", look))):
            self.sections.addItem(name)
            self.pages.addWidget(_Page(page, name, fill=page is self.mcp))
        for row in range(self.sections.count()):  # roomier rows than a plain list's
            item = self.sections.item(row)
            hint = self.sections.sizeHintForIndex(self.sections.indexFromItem(item))
            item.setSizeHint(QSize(hint.width(), hint.height() + 10))
        self.sections.setFixedWidth(self.sections.sizeHintForColumn(0)
                                    + 2 * self.sections.frameWidth() + 24)
        self.sections.currentRowChanged.connect(self.pages.setCurrentIndex)
        self.sections.setCurrentRow(0)
        for keys, step in ((QKeySequence.StandardKey.NextChild, 1),
                           (QKeySequence.StandardKey.PreviousChild, -1),
                           (QKeySequence("Ctrl+PgDown"), 1), (QKeySequence("Ctrl+PgUp"), -1)):
            shortcut = QShortcut(keys, self)
            shortcut.activated.connect(lambda step=step: self.step_page(step))

        top = QHBoxLayout()
        top.addWidget(self.sections)
        top.addWidget(self.pages, 1)
        column = QVBoxLayout(self)
        column.addLayout(top, 1)
        column.addWidget(self.effect_label)
        column.addWidget(self.buttons)

        for spin in (self.n_ctx, self.n_gpu_layers, self.n_threads, self.ram_budget,
                     self.interval, self.seed, self.max_tokens, self.api_port):
            spin.valueChanged.connect(self._update)
        for double in (self.temperature, self.top_p, *self.samplers.values()):
            double.valueChanged.connect(self._update)
        for combo in (self.flash_attn, self.type_k, self.type_v, self.theme, self.overflow):
            combo.currentIndexChanged.connect(self._update)
        self.disk_tier.toggled.connect(self._update)
        self.api_server.toggled.connect(self._update)
        self.api_key.textChanged.connect(self._update)
        self.rpc_workers.textChanged.connect(self._update)
        self._update()

    def page_names(self) -> list[str]:
        """The pages, as the list names them, in its order."""
        return [self.sections.item(row).text() for row in range(self.sections.count())]

    def show_page(self, name: str) -> None:
        """Show the page called `name` (as the list says it)."""
        self.sections.setCurrentRow(self.page_names().index(name))

    def step_page(self, step: int) -> None:
        """Show the next (1) or previous (-1) page, round the end as tabs do."""
        count = self.sections.count()
        self.sections.setCurrentRow((self.sections.currentRow() + step) % count)

    def showEvent(self, event: QShowEvent) -> None:
        """Open at the size the pages want, within the screen's free area (Qt's own first
        size stops at two thirds of the screen, which scrolls the longer pages on a laptop
        for nothing)."""
        if not event.spontaneous() and not self.isMaximized():
            self.resize(open_size(self.sizeHint().expandedTo(self.size()),
                                  self.minimumSizeHint(),
                                  self.screen().availableGeometry().size()))
        super().showEvent(event)

    def chosen(self) -> Settings:
        """The settings as edited. Raises SettingsError for a combination that cannot work."""
        seed = self.seed.value()
        return replace(
            self._current,
            n_ctx=self.n_ctx.value(),
            n_gpu_layers=self.n_gpu_layers.value(),
            n_threads=self.n_threads.value(),
            flash_attn=self.flash_attn.currentData(),
            type_k=self.type_k.currentData(),
            type_v=self.type_v.currentData(),
            checkpoint_ram_mib=self.ram_budget.value(),
            disk_tier=self.disk_tier.isChecked(),
            checkpoint_interval=self.interval.value(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            **editor_values(self.samplers),
            seed=None if seed < 0 else seed,
            max_tokens=self.max_tokens.value(),
            overflow=self.overflow.currentData(),
            theme=self.theme.currentData(),
            api_server=self.api_server.isChecked(),
            api_port=self.api_port.value(),
            api_key=self.api_key.text().strip(),
            rpc_workers=tuple(w for w in self.rpc_workers.text().replace(",", " ").split()),
            mcp_servers=tuple(self.mcp.servers),
        )

    def effect(self) -> Effect | None:
        """What applying costs; None while the form holds an impossible combination."""
        try:
            return effect_of(self._current, self.chosen())
        except SettingsError:
            return None

    def _update(self) -> None:
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        try:
            effect = effect_of(self._current, self.chosen())
        except SettingsError as exc:
            self.effect_label.setText(f"Cannot apply: {exc}.")
            ok.setEnabled(False)
            return
        problem = self.token.problem()
        ok.setEnabled(problem is None)
        self.effect_label.setText(f"Cannot save the token: {problem}." if problem
                                  else _EFFECT_TEXT[effect])


# Room left around the dialog for its title bar and borders, which Qt does not count in its
# size: the window manager draws them.
WINDOW_FRAME = QSize(16, 48)


def open_size(wanted: QSize, least: QSize, screen: QSize) -> QSize:
    """The size to open at: `wanted`, within a free screen area of `screen` less the window's
    frame, never under `least` (the pages then scroll)."""
    return wanted.boundedTo(screen - WINDOW_FRAME).expandedTo(least)


class _Page(QScrollArea):
    """One page: its box at the top (or filling it, `fill`), scrolled when the dialog is
    shorter than the box. It wants the box's full width (no sideways scrolling) and, like any
    scroll area, at most 24 lines' height."""

    def __init__(self, box: QWidget, name: str, *, fill: bool = False) -> None:
        super().__init__()
        self.setObjectName(f"settings-page-{name.lower().replace(' ', '-')}")
        self.setAccessibleName(name)
        self.content = content = QWidget()
        column = QVBoxLayout(content)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(box, 1 if fill else 0)
        if not fill:
            column.addStretch(1)
        self.setWidget(content)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # Tab goes to the fields; they scroll in

    def _width(self, content: int) -> int:
        return content + 2 * self.frameWidth() + self.verticalScrollBar().sizeHint().width()

    def sizeHint(self) -> QSize:
        content = self.content.sizeHint()
        return QSize(self._width(content.width()), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        content = self.content.minimumSizeHint()
        return QSize(self._width(content.width()), super().minimumSizeHint().height())


def _box(title: str, form: QFormLayout) -> QGroupBox:
    box = QGroupBox(title)
    box.setLayout(form)
    return box


def _spin(low: int, high: int, value: int, suffix: str, *, step: int = 1) -> QSpinBox:
    spin = QSpinBox(minimum=low, maximum=high, singleStep=step, suffix=suffix)
    spin.setValue(value)
    spin.setAlignment(Qt.AlignmentFlag.AlignRight)
    return spin


def _kv_box(current: str) -> QComboBox:
    box = QComboBox()
    for name in KV_TYPE_NAMES:
        box.addItem(name, name)
    box.setCurrentIndex(list(KV_TYPE_NAMES).index(current))
    return box
