"""Arbor's main window: conversations, the branching chat, the tree panel, the composer.

The GUI thread owns the trees and the store. Everything that touches llama.cpp goes to the
EngineWorker on its own QThread as an immutable request; results come back as signals and are
applied here. Node ids sent to the engine are global (conversation << 32 | node), so the
engine's checkpoints from different conversations never collide.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from PySide6.QtCore import QByteArray, QMetaObject, QSettings, Qt, QThread, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.chat_model import rows_from_tree
from app.chat_view import ChatView
from app.composer import Composer
from app.icons import icon
from app.importer import ImportedFile, Importer, RejectedFile
from app.messages import (
    AdoptCheckpoints,
    ExportDone,
    ExportRequest,
    Failed,
    GenerateRequest,
    LoadProgress,
    LoadRequest,
    ModelLoaded,
    NodeView,
    Piece,
    Plan,
    Progress,
    ReplyDone,
    StoreUsage,
    Warmed,
    WarmRequest,
)
from app.model_picker import ModelPicker
from app.settings_dialog import SettingsDialog
from app.sidebar import Sidebar
from app.theme import apply_theme, theme_events
from app.tree_panel import TreePanel, panel_nodes_from_tree
from app.worker import EngineWorker
from engine.conversation import Conversation
from engine.errors import ArborError
from engine.paths import data_dirs
from engine.settings import Effect, Settings, SettingsError, effect_of, load_settings, save_settings
from engine.store import Store, StoreSink
from engine.transfer import FileFormat, export_file
from engine.tree import Node, NodeStatus, Role, Tree, TreeError

log = logging.getLogger(__name__)
T = TypeVar("T")

# Quiet time after the user's last move before the engine warms the likely next prompt.
WARM_DELAY_MS = 250


def global_id(conversation_id: int, node_id: int) -> int:
    return (conversation_id << 32) | node_id


def split_id(key: int) -> tuple[int, int]:
    return key >> 32, key & 0xFFFFFFFF


@dataclass
class _Streaming:
    request_id: int
    conversation_id: int
    reply_id: int
    started: float
    pieces: int = 0


class MainWindow(QMainWindow):
    request_load = Signal(object)
    request_generate = Signal(object)
    request_forget = Signal(object)
    request_configure = Signal(object)
    request_warm = Signal(object)
    request_export = Signal(object)
    request_adopt = Signal(object)
    # Emitted on the GUI thread once a worker result is applied (tests and other widgets
    # wait on these, never on the worker's own signals, which fire on the engine thread).
    reply_finished = Signal()
    model_ready = Signal()
    model_failed = Signal()
    text_shown = Signal()
    warmed = Signal(object)  # Warmed, once applied
    settings_applied = Signal()
    import_finished = Signal(object)  # list[int]: the new conversations, [] on failure
    export_finished = Signal(object)  # ExportDone

    def __init__(
        self,
        *,
        store: Store | None = None,
        model_path: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        super().__init__()
        self.setWindowTitle("Arbor")
        self.resize(1200, 800)
        self.store = store or Store()
        self._model_path = model_path
        self.conversations: dict[int, Conversation] = {}  # the open ones, by id
        self.current: int | None = None
        self._streaming: _Streaming | None = None
        self._request_ids = itertools.count(1)
        self._undo: list[tuple[str, Callable[[], None]]] = []
        self._checkpoint_nodes: dict[int, dict[int, str]] = {}
        self._model: ModelLoaded | None = None
        self._usage: StoreUsage | None = None
        self._prepare_started = 0.0
        self._sink: StoreSink | None = None
        self._plan: Plan | None = None
        self.last_reply: ReplyDone | None = None
        self._warmed_path: tuple[int, ...] | None = None  # what the last warm-up prepared
        self._editing: int | None = None  # the message being edited in place, if any
        self._pending_edit: tuple[int, int, str] | None = None  # submitted during a reply
        # The program passes the settings it loaded (and reported a bad file for).
        self.settings = settings if settings is not None else load_settings().settings
        self._warm_timer = QTimer(self, singleShot=True, interval=WARM_DELAY_MS)
        self._warm_timer.timeout.connect(self._warm_now)
        self.importer = self._make_importer()

        self.sidebar = Sidebar()
        self.chat = ChatView()
        self.composer = Composer()
        self.composer.setMaximumHeight(120)
        self.send_button = QPushButton("Send")
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.progress_label = QLabel()
        self.tree_panel = TreePanel()
        self._build_layout()
        self._build_actions()
        self._connect()

        self._thread = QThread(self)
        self._thread.setObjectName("arbor-engine")
        self.worker = EngineWorker()
        self.worker.moveToThread(self._thread)
        self.request_load.connect(self.worker.load)
        self.request_generate.connect(self.worker.generate)
        self.request_forget.connect(self.worker.forget)
        self.request_configure.connect(self.worker.configure)
        self.request_warm.connect(self.worker.warm)
        self.request_export.connect(self.worker.export_session)
        self.request_adopt.connect(self.worker.adopt)
        self.worker.exported.connect(self._on_exported)
        self.worker.load_progress.connect(self._on_load_progress)
        self.worker.planned.connect(self._on_plan)
        self.worker.warmed.connect(self._on_warmed)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.template_changed.connect(self._on_template_changed)
        self.worker.load_failed.connect(self._on_load_failed)
        self.worker.progress.connect(self._on_progress)
        self.worker.yielded.connect(self._on_piece)
        self.worker.returned.connect(self._on_reply)
        self.worker.aborted.connect(self._on_failed)
        self.worker.errored.connect(self._on_failed)
        self.worker.usage.connect(self._on_usage)
        self._thread.start()

        self._restore_geometry()
        self._refresh_sidebar()
        conversations = self.store.list()
        if conversations:
            self.open_conversation(conversations[0].id)
        else:
            self.new_conversation()

    # --- layout ----------------------------------------------------------------------------

    def _build_layout(self) -> None:
        row = QHBoxLayout()
        row.addWidget(self.composer)
        row.addWidget(self.send_button)
        center = QWidget()
        column = QVBoxLayout(center)
        column.addWidget(self.chat, 1)
        column.addWidget(self.progress_label)
        column.addWidget(self.progress)
        column.addLayout(row)
        self.splitter = QSplitter()
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(center)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([260, 940])
        self.setCentralWidget(self.splitter)
        self.tree_dock = QDockWidget("Conversation tree", self)
        self.tree_dock.setObjectName("tree-dock")
        self.tree_dock.setWidget(self.tree_panel)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.tree_dock)
        self.resizeDocks([self.tree_dock], [260], Qt.Orientation.Horizontal)
        self.status_model = QLabel("Loading the model…")
        self.status_store = QLabel()
        self.statusBar().addPermanentWidget(self.status_store)
        self.statusBar().addPermanentWidget(self.status_model)

    def _build_actions(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self.action_new = self._action("New conversation", "Ctrl+N", self.new_conversation)
        file_menu.addAction(self.action_new)
        self.action_models = self._action("Models…", "Ctrl+M", self.pick_model)
        file_menu.addAction(self.action_models)
        file_menu.addAction(self._action("Open GGUF model…", "Ctrl+O", self._open_model))
        file_menu.addSeparator()
        self.action_import = self._action("Import…", "Ctrl+I", self._import)
        file_menu.addAction(self.action_import)
        self.action_export = self._action("Export as session file…", "Ctrl+Shift+E",
                                          lambda: self._export(FileFormat.NATIVE))
        file_menu.addAction(self.action_export)
        file_menu.addAction(self._action("Export as ChatGPT JSON…", None,
                                         lambda: self._export(FileFormat.CHATGPT)))
        file_menu.addAction(self._action("Export branch as Markdown…", None,
                                         lambda: self._export(FileFormat.MARKDOWN)))
        file_menu.addSeparator()
        self.action_settings = self._action("Settings…", "Ctrl+,", self.edit_settings)
        file_menu.addAction(self.action_settings)
        file_menu.addSeparator()
        file_menu.addAction(self._action("Quit", "Ctrl+Q", self.close))
        edit_menu = self.menuBar().addMenu("&Edit")
        self.action_undo = self._action("Undo", "Ctrl+Z", self.undo)
        edit_menu.addAction(self.action_undo)
        self.action_continue = self._action("Continue the reply", "Ctrl+Shift+Return",
                                            self.continue_last)
        edit_menu.addAction(self.action_continue)
        self.action_regenerate_last = self._action("Regenerate the last reply", "Ctrl+Shift+R",
                                                   self.regenerate_last)
        edit_menu.addAction(self.action_regenerate_last)
        self.action_system = self._action("System prompt…", "Ctrl+Shift+P",
                                          self._system_prompt_dialog)
        edit_menu.addAction(self.action_system)
        edit_menu.addSeparator()
        edit_menu.addAction(self._action("Rename conversation…", "Ctrl+Shift+N",
                                         lambda: self._rename_current()))
        edit_menu.addAction(self._action("Delete conversation", "Ctrl+Shift+Delete",
                                         lambda: self._delete_current()))
        message_menu = self.menuBar().addMenu("&Message")
        for action in self.chat.actions():
            message_menu.addAction(action)  # shortcuts stay scoped to the chat view
        view_menu = self.menuBar().addMenu("&View")
        toggle = self.tree_dock.toggleViewAction()
        toggle.setShortcut(QKeySequence("Ctrl+T"))
        view_menu.addAction(toggle)
        view_menu.addSeparator()
        self.action_search = self._action("Search conversations", "Ctrl+F", self._focus_search)
        view_menu.addAction(self.action_search)
        view_menu.addAction(self._action("Write a message", "Ctrl+L", self._focus_composer))
        view_menu.addAction(self._action("Go to the messages", "Ctrl+J",
                                         lambda: self.chat.setFocus()))
        view_menu.addAction(self._action("Next conversation", "Ctrl+PgDown",
                                         lambda: self._step_conversation(1)))
        view_menu.addAction(self._action("Previous conversation", "Ctrl+PgUp",
                                         lambda: self._step_conversation(-1)))
        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction(self._action("Keyboard shortcuts", "F1", self._show_shortcuts))
        toolbar = self.addToolBar("Main")
        toolbar.setObjectName("main-toolbar")
        self.action_tree = toggle
        self.action_stop = self._action("Stop", "Esc", self.stop)
        edit_menu.insertAction(self.action_continue, self.action_stop)
        for item in (self.action_new, self.action_models, self.action_tree, None,
                     self.action_undo, self.action_stop, None, self.action_settings):
            if item is None:
                toolbar.addSeparator()
            else:
                toolbar.addAction(item)
        self._apply_icons()
        theme_events.changed.connect(self._apply_icons)

    @Slot()
    def _apply_icons(self) -> None:
        """Icons are drawn in the palette's text colour: fetched again on a theme change."""
        chat = self.chat
        pairs: list[tuple[QAction, str]] = [
            (self.action_new, "new_conversation"), (self.action_models, "model"),
            (self.action_tree, "tree_panel"), (self.action_undo, "undo"),
            (self.action_stop, "stop"), (self.action_settings, "settings"),
            (self.action_import, "import"), (self.action_export, "export"),
            (self.action_continue, "continue"), (self.action_regenerate_last, "regenerate"),
            (self.action_search, "search"), (chat.edit_action, "edit"),
            (chat.regenerate_action, "regenerate"), (chat.rewind_action, "rewind"),
            (chat.fork_action, "fork"), (chat.copy_action, "copy"),
            (chat.delete_action, "delete"), (chat.previous_variant_action, "previous"),
            (chat.next_variant_action, "next"),
        ]
        for action, name in pairs:
            action.setIcon(icon(name))
        self._update_send_button()

    def _update_send_button(self) -> None:
        streaming = self._streaming is not None
        self.send_button.setText("Stop" if streaming else "Send")
        self.send_button.setIcon(icon("stop" if streaming else "send"))

    def _action(self, text: str, shortcut: str | None, slot: Callable[[], object]) -> QAction:
        action = QAction(text, self)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
            action.setToolTip(f"{text.rstrip('…')} ({QKeySequence(shortcut).toString()})")
        action.triggered.connect(slot)
        return action

    def _connect(self) -> None:
        self.sidebar.opened.connect(self.open_conversation)
        self.sidebar.new_requested.connect(self.new_conversation)
        self.sidebar.rename_requested.connect(self._rename)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.search_changed.connect(self._on_search)
        self.composer.submitted.connect(self.send)
        self.composer.stop_requested.connect(self.stop)
        self.send_button.clicked.connect(self._on_send_clicked)
        self.chat.variant_requested.connect(self.switch_variant)
        self.chat.edit_submitted.connect(self.edit)
        self.chat.edit_started.connect(self._on_edit_started)
        self.chat.edit_cancelled.connect(self._on_edit_cancelled)
        self.chat.regenerate_requested.connect(self.regenerate)
        self.chat.rewind_requested.connect(self.rewind)
        self.chat.fork_requested.connect(self.fork)
        self.chat.delete_requested.connect(self.delete_branch)
        self.tree_panel.node_clicked.connect(self.activate_node)

    # --- model -----------------------------------------------------------------------------

    def load_model(self, path: str) -> None:
        self.status_model.setText(f"Loading {Path(path).name}…")
        self._show_busy(f"Loading {Path(path).name}…")
        self.worker.preempt()
        self.request_load.emit(LoadRequest(path=path, settings=self.settings))

    @Slot(object)
    def _on_load_progress(self, progress: LoadProgress) -> None:
        if self._streaming is not None:
            return
        self.progress.setVisible(True)
        self.progress.setMaximum(1000)
        self.progress.setValue(int(progress.fraction * 1000))
        self.progress.setFormat(f"{progress.fraction * 100:.0f}%")

    @Slot(object)
    def _on_loaded(self, info: ModelLoaded) -> None:
        self._model = info
        self._warmed_path = None  # a new context holds nothing
        self._hide_busy()
        self._update_status()
        for notice in info.notices:
            self.statusBar().showMessage(notice, 10_000)
        if self.settings.model != info.path:
            self._apply_settings(replace(self.settings, model=info.path), send=False)
        self.model_ready.emit()
        self._schedule_warm()

    @Slot(str)
    def _on_template_changed(self, description: str) -> None:
        if self._model is not None:
            self._model = replace(self._model, template=description)
            self._update_status()
        self.statusBar().showMessage(f"Chat template for new messages: {description}", 10_000)
        self._warmed_path = None  # the next prompt's opening may render differently now
        self._schedule_warm()

    @Slot(str)
    def _on_load_failed(self, message: str) -> None:
        self._hide_busy()
        self._update_status()
        QMessageBox.warning(self, "Arbor", f"The model could not be loaded.\n\n{message}")
        self.model_failed.emit()

    @Slot()
    def _open_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open GGUF model", str(data_dirs().models),
                                              "GGUF models (*.gguf)")
        if path:
            self.load_model(path)

    @Slot()
    def pick_model(self) -> None:
        loaded = self._model.path if self._model else None
        picker = ModelPicker(loaded, self, settings=self.settings)
        if picker.exec() == ModelPicker.DialogCode.Accepted:
            chosen = picker.chosen()
            if chosen is not None:
                self.choose_model(chosen, picker.chosen_template())
        picker.deleteLater()

    def choose_model(self, path: Path, template: str | None) -> None:
        """Load `path`, with `template` (None: automatic) for its new messages. A new
        template for the loaded model applies at once, without loading it again."""
        updated = self.settings.with_template(path, template)
        same = self._model is not None and Path(self._model.path) == path
        if same and updated != self.settings:
            self.apply_settings(updated)  # the engine renders new messages with it
            return
        if updated != self.settings and not self._apply_settings(updated, send=False):
            return
        self.load_model(str(path))

    @Slot()
    def edit_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self)
        if dialog.exec() == SettingsDialog.DialogCode.Accepted:
            try:
                chosen = dialog.chosen()
            except SettingsError as exc:  # the OK button is disabled for these; belt and braces
                QMessageBox.warning(self, "Arbor", str(exc))
            else:
                self.apply_settings(chosen)
        dialog.deleteLater()

    def apply_settings(self, settings: Settings) -> Effect:
        """Save and apply. A change that needs a new context reloads the model (replies wait
        for it), and one that leaves the saved checkpoints unusable says so."""
        effect = effect_of(self.settings, settings)
        if effect is Effect.NONE:
            return effect
        theme_changed = settings.theme != self.settings.theme
        if not self._apply_settings(settings, send=True):
            return Effect.NONE
        app = QApplication.instance()
        if theme_changed and isinstance(app, QApplication):
            apply_theme(app, settings.theme)
        if effect is Effect.INVALIDATE:
            self.statusBar().showMessage(
                "New context settings: the saved checkpoints do not fit them, so the next "
                "reply in each conversation reads it from the start.", 12_000)
        elif effect is Effect.RELOAD:
            self.statusBar().showMessage("Loading the model again with the new settings…", 8000)
        if effect in (Effect.RELOAD, Effect.INVALIDATE) and self._model is not None:
            self._model = None  # replies wait for the reload
            self._show_busy("Loading the model again…")
        self.settings_applied.emit()
        return effect

    def _apply_settings(self, settings: Settings, *, send: bool) -> bool:
        try:
            save_settings(settings)
        except SettingsError as exc:
            QMessageBox.warning(self, "Arbor", str(exc))
            return False
        self.settings = settings
        if send:
            self.worker.preempt()
            self.request_configure.emit(settings)
        return True

    def _show_busy(self, text: str) -> None:
        if self._streaming is not None:
            return
        self.progress_label.setText(text)
        self.progress.setVisible(True)
        self.progress.setMaximum(0)  # busy until the loader reports progress

    def _hide_busy(self) -> None:
        if self._streaming is None:
            self.progress.setVisible(False)
            self.progress_label.clear()

    @Slot(object)
    def _on_usage(self, usage: StoreUsage) -> None:
        self._usage = usage
        shown = self._checkpoint_nodes.get(self.current) if self.current is not None else None
        self._checkpoint_nodes = {}
        for key, tier in usage.nodes:
            cid, nid = split_id(key)
            self._checkpoint_nodes.setdefault(cid, {})[nid] = tier
        self._update_status()
        if self.current is not None and self._checkpoint_nodes.get(self.current) != shown:
            self._refresh_views()  # only the marks changed; nothing to redraw otherwise

    def _update_status(self) -> None:
        if self._model is not None:
            m = self._model
            self.status_model.setText(
                f"{m.name} · {m.memory_kind.replace('_', ' ')} · {m.backend} · ctx {m.n_ctx}"
            )
            self.status_model.setToolTip(f"{m.path}\nChat template: {m.template}")
        if self._usage is not None:
            u = self._usage
            self.status_store.setText(
                f"checkpoints: {u.count} · RAM {u.ram_bytes / 2**20:.0f} of "
                f"{u.ram_budget / 2**20:.0f} MiB · disk {u.disk_bytes / 2**20:.0f} MiB"
            )

    # --- conversations -----------------------------------------------------------------------

    @property
    def conversation(self) -> Conversation:
        assert self.current is not None
        return self.conversations[self.current]

    @property
    def tree(self) -> Tree:
        return self.conversation.tree

    def _refresh_sidebar(self, query: str = "") -> None:
        hits = self.store.search(query) if query.strip() else None
        self.sidebar.show_conversations(self.store.list(), self.current, hits)

    @Slot(str)
    def _on_search(self, query: str) -> None:
        self._refresh_sidebar(query)

    @Slot()
    def new_conversation(self) -> None:
        tree = Tree()
        cid = self._fetch(lambda: self.store.create(tree, title="New conversation"))
        if cid is None:
            return
        self.conversations[cid] = Conversation(tree)
        self.current = cid
        self._refresh_sidebar()
        self._refresh_views()
        self.composer.setFocus()

    @Slot(int)
    def open_conversation(self, conversation_id: int) -> None:
        if conversation_id not in self.conversations:
            tree = self._fetch(lambda: self.store.load(conversation_id))
            if tree is None:
                return
            self.conversations[conversation_id] = Conversation(tree)
        self.current = conversation_id
        self._refresh_sidebar(self.sidebar.search.text())
        self._refresh_views()

    @Slot(int)
    def _rename(self, conversation_id: int) -> None:
        title, ok = QInputDialog.getText(self, "Rename", "Title:")
        if ok and title.strip():
            self._attempt(lambda: self.store.rename(conversation_id, title.strip()))
            self._refresh_sidebar()

    def _rename_current(self) -> None:
        if self.current is not None:
            self._rename(self.current)

    def _delete_current(self) -> None:
        if self.current is not None:
            self.delete_conversation(self.current)

    def _focus_search(self) -> None:
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    def _focus_composer(self) -> None:
        self.composer.setFocus()

    def _step_conversation(self, step: int) -> None:
        """The next or previous conversation in the sidebar's order (newest first)."""
        ids = [c.id for c in self.store.list()]
        if not ids:
            return
        index = ids.index(self.current) if self.current in ids else 0
        self.open_conversation(ids[(index + step) % len(ids)])

    def shortcut_table(self) -> list[tuple[str, str]]:
        """(action, keys) for every action with a shortcut, in menu order."""
        rows: list[tuple[str, str]] = []
        for menu_action in self.menuBar().actions():
            menu = menu_action.menu()
            if not isinstance(menu, QMenu):
                continue
            for action in menu.actions():
                keys = ", ".join(k.toString(QKeySequence.SequenceFormat.NativeText)
                                 for k in action.shortcuts())
                if keys:
                    rows.append((action.text().replace("&", "").rstrip("…"), keys))
        rows.append(("Send the message (in the composer)", "Enter"))
        rows.append(("New line (in the composer)", "Shift+Enter"))
        return rows

    def _show_shortcuts(self) -> None:
        rows = "".join(f"<tr><td>{name}</td><td><b>{keys}</b></td></tr>"
                       for name, keys in self.shortcut_table())
        box = QMessageBox(QMessageBox.Icon.NoIcon, "Keyboard shortcuts",
                          f"<table cellspacing='6'>{rows}</table>", parent=self)
        box.exec()
        box.deleteLater()

    @Slot(int)
    def delete_conversation(self, conversation_id: int) -> None:
        if not self._attempt(lambda: self.store.delete(conversation_id)):
            return

        def undo() -> None:
            self.store.undelete(conversation_id)
            self.open_conversation(conversation_id)

        self._push_undo("Conversation deleted", undo)
        self.conversations.pop(conversation_id, None)
        remaining = self.store.list()
        if remaining:
            self.open_conversation(remaining[0].id)
        else:
            self.new_conversation()

    # --- messages ----------------------------------------------------------------------------

    @Slot()
    def _on_send_clicked(self) -> None:
        if self._streaming is not None:
            self.stop()
            return
        text = self.composer.toPlainText().strip()
        if text:
            self.send(text)

    @Slot(str)
    def send(self, text: str) -> None:
        if self._busy():
            return
        leaf = self.tree.active_leaf
        (message,) = Conversation(self.tree).send(text).nodes
        if not self._save([message]):
            self._drop_unsaved(message, leaf)  # the composer keeps the text
            return
        self.composer.clear()
        self._start_reply(message)

    def edit(self, node_id: int, text: str) -> None:
        """A new version beside the old one; a user message gets a new reply. Submitted while
        a reply streams, the edit waits for the reply to stop (it is stopped), never lost."""
        self._editing = None
        if self._streaming is not None and self.current is not None:
            self._pending_edit = (self.current, node_id, text)
            self.stop()
            self.statusBar().showMessage("Stopping the reply to answer your edit…", 4000)
            return
        if self._busy():
            return
        leaf = self.tree.active_leaf
        change = Conversation(self.tree).edit(node_id, text)
        (new,) = change.nodes
        if not self._save([new]):
            self._drop_unsaved(new, leaf)
            return
        if change.reply is not None:
            self._start_reply(new)
        self._refresh_views()

    @Slot(int)
    def regenerate(self, node_id: int) -> None:
        if self._busy():
            return
        try:
            job = Conversation(self.tree).regenerate(node_id).reply
        except TreeError:
            return
        assert job is not None
        self._start_reply(self.tree.node(job.parent))

    def _last_reply(self) -> Node | None:
        """The active branch's last message if it is a reply."""
        if self.current is None:
            return None
        last = self.tree.node(self.tree.active_leaf)
        return last if last.role is Role.ASSISTANT else None

    @Slot()
    def regenerate_last(self) -> None:
        """A new version of the active branch's last reply."""
        if (last := self._last_reply()) is not None:
            self.regenerate(last.id)

    @Slot()
    def _system_prompt_dialog(self) -> None:
        if self.current is None:
            return
        root = self.tree.node(self.tree.root.id)
        text, ok = QInputDialog.getMultiLineText(
            self, "System prompt", "Instructions for the model in this conversation "
            "(empty: the model's own default):", root.text)
        if ok:
            self.set_system_prompt(text.strip())

    def set_system_prompt(self, text: str) -> None:
        """The conversation's system prompt. Later messages keep their text; the next reply
        is prepared with the new instructions (checkpoints of the old prefix no longer match,
        by construction: they are keyed by the tokens they hold)."""
        if self._streaming is not None and self._streaming.conversation_id == self.current:
            self._busy()
            return
        change = Conversation(self.tree).set_system(text)
        if change.nodes:
            self._save(list(change.nodes))
            self._refresh_views()

    @Slot()
    def continue_last(self) -> None:
        """Continue the active branch's last reply (an interrupted one, typically)."""
        if (last := self._last_reply()) is not None:
            self.continue_reply(last.id)

    @Slot(int)
    def continue_reply(self, node_id: int) -> None:
        """More of an interrupted reply."""
        if self._busy():
            return
        if self.tree.node(node_id).role is not Role.ASSISTANT:
            return
        job = Conversation(self.tree).continue_reply(node_id).reply
        assert job is not None and job.resume is not None
        self._start_reply(self.tree.node(job.parent), resume=self.tree.node(job.resume))

    @Slot(int)
    def rewind(self, node_id: int) -> None:
        Conversation(self.tree).rewind(node_id)
        self._save([])
        self._refresh_views()
        self.composer.setFocus()

    @Slot(int, int)
    def switch_variant(self, node_id: int, variant: int) -> None:
        try:
            Conversation(self.tree).switch(node_id, variant)
        except TreeError:
            return
        self._save([])
        self._refresh_views()
        self.chat.scroll_to_node(self.tree.siblings(node_id)[variant])

    @Slot(int)
    def activate_node(self, node_id: int) -> None:
        """Tree panel click: that node's branch becomes active; the chat shows the node."""
        if node_id not in self.tree:
            return
        Conversation(self.tree).activate(node_id)
        self._save([])
        self._refresh_views()
        self.chat.scroll_to_node(node_id)

    @Slot(int)
    def fork(self, node_id: int) -> None:
        assert self.current is not None
        source = self.current
        cid = self._fetch(lambda: self.store.fork(source, node_id))
        if cid is not None:
            self.open_conversation(cid)

    @Slot(int)
    def delete_branch(self, node_id: int) -> None:
        if self._streaming is not None and self._streaming.conversation_id == self.current:
            return  # never delete under a streaming reply
        if self.tree.node(node_id).parent is None:
            return
        change = self.conversation.delete_branch(node_id)
        self._save([], deleted=change.deleted)
        assert self.current is not None and change.undo is not None
        cid, branch = self.current, change.undo
        self.request_forget.emit(tuple(global_id(cid, i) for i in change.deleted))

        def undo() -> None:
            self.open_conversation(cid)  # loaded again if it was closed since
            restored = self.conversations[cid].restore(branch)
            self.store.save(cid, self.conversations[cid].tree, list(restored.nodes))
            self.open_conversation(cid)

        self._push_undo("Branch deleted", undo)
        self._refresh_views()

    def _push_undo(self, what: str, undo: Callable[[], None]) -> None:
        self._undo.append((what, undo))
        self.statusBar().showMessage(f"{what}. Ctrl+Z to undo.", 8_000)

    @Slot()
    def undo(self) -> None:
        if not self._undo:
            return
        what, action = self._undo.pop()
        if self._attempt(action):
            self.statusBar().showMessage(f"Undone: {what.lower()}.", 4_000)

    # --- generation ----------------------------------------------------------------------------

    def _busy(self) -> bool:
        if self._streaming is not None:
            self.statusBar().showMessage("Arbor is still answering; press Esc to stop it.", 4000)
            return True
        if self._model is None:
            self.statusBar().showMessage("The model is still loading.", 4000)
            return True
        return False

    def _start_reply(self, parent: Node, *, resume: Node | None = None) -> None:
        assert self.current is not None
        cid = self.current
        tree = self.tree
        leaf = tree.active_leaf
        if resume is None:
            reply = tree.add_child(parent.id, Role.ASSISTANT, "", status=NodeStatus.STREAMING)
        else:
            reply = resume
            reply.status = NodeStatus.STREAMING
        if not self._save([reply]):
            if resume is None:
                self._drop_unsaved(reply, leaf)
            else:
                resume.status = NodeStatus.INTERRUPTED
                self._refresh_views()
            return
        request_id = next(self._request_ids)
        path = tree.path_to(parent.id)
        self._streaming = _Streaming(request_id, cid, reply.id, time.monotonic())
        self._sink = StoreSink(self.store, cid)
        self._plan = None
        self._warm_timer.stop()
        self._warmed_path = None
        self.worker.preempt()  # a warm-up in flight stops within a chunk
        seed = self.conversations[cid].reply_seed(self.settings.seed)
        self.request_generate.emit(
            GenerateRequest(
                request_id=request_id,
                conversation_id=cid,
                reply_id=reply.id,
                path=tuple(_global_view(cid, n) for n in path),
                resume=_global_view(cid, resume) if resume is not None else None,
                max_tokens=self.settings.max_tokens,
                seed=seed,
            )
        )
        self._prepare_started = time.monotonic()
        self._update_send_button()
        self.sidebar.set_generating(cid)
        self._refresh_views()

    @Slot()
    def stop(self) -> None:
        if self._streaming is not None:
            self.worker.request_stop()

    def _answering(self, request_id: int) -> _Streaming | None:
        """The reply in progress if a result belongs to it; a late result of a stopped or
        superseded request finds None and is dropped."""
        streaming = self._streaming
        return streaming if streaming is not None and streaming.request_id == request_id else None

    @Slot(object)
    def _on_progress(self, progress: Progress) -> None:
        if self._answering(progress.request_id) is None:
            return
        total = max(1, progress.total)
        percent = 100 * progress.done // total
        elapsed = time.monotonic() - self._prepare_started
        eta = elapsed / progress.done * (total - progress.done) if progress.done else 0.0
        self.progress.setVisible(progress.done < progress.total)
        self.progress.setMaximum(total)
        self.progress.setValue(progress.done)
        self.progress.setFormat(f"{percent}% · about {eta:.0f} s left")
        self.progress_label.setText(self._plan_text(progress.total))

    @Slot(object)
    def _on_piece(self, piece: Piece) -> None:
        streaming = self._answering(piece.request_id)
        if streaming is None:
            return
        tree = self._tree_of(piece.conversation_id)
        if tree is None or piece.reply_id not in tree:
            return
        node = tree.node(piece.reply_id)
        node.text += piece.text
        streaming.pieces += 1
        self.progress.setVisible(False)
        rate = streaming.pieces / max(1e-3, time.monotonic() - streaming.started)
        self.progress_label.setText(f"Answering… {rate:.1f} tokens/s")
        if self._sink is not None:
            try:
                self._sink.streaming(node)  # saved at most a second behind
            except ArborError as exc:  # a full disk, say: the final save will say so too
                log.warning("the growing reply could not be saved: %s", exc)
                self.statusBar().showMessage(f"The reply could not be saved yet: {exc}", 4000)
        if piece.conversation_id == self.current:
            self.chat.model().update_text(node.id, node.text, node.status.value)
        self.text_shown.emit()

    @Slot(object)
    def _on_reply(self, done: ReplyDone) -> None:
        if self._answering(done.request_id) is None:
            return
        self.last_reply = done  # the figures of the last step (the status bar shows them)
        tree = self._tree_of(done.conversation_id)
        if tree is not None:
            changed = _adopt_tokens(tree, done.node_tokens)
            reply = tree.node(done.reply_id)
            reply.text = done.text
            reply.tokens = done.tokens
            reply.meta.update(dict(done.meta))
            reply.meta["finish"] = done.finish
            reply.status = (NodeStatus.INTERRUPTED if done.finish == "cancelled"
                            else NodeStatus.COMPLETE)
            self._save([*changed, reply], conversation_id=done.conversation_id)
        source = {"live": "reused the live cache",
                  "checkpoint": f"restored checkpoint at {done.checkpoint_pos}",
                  "none": "read from scratch"}[done.source]
        self.statusBar().showMessage(
            f"{source}: {done.reused_tokens:,} of {done.prompt_tokens:,} tokens reused, "
            f"{done.decoded_tokens:,} decoded in {done.prefill_ms / 1000:.2f} s; first token "
            f"after {(done.ttft_ms or 0) / 1000:.2f} s; {done.generated_tokens} tokens at "
            f"{done.generated_tokens / max(done.decode_ms / 1000, 1e-3):.1f}/s"
        )
        self._end_reply()

    @Slot(object)
    def _on_failed(self, failed: Failed) -> None:
        if self._answering(failed.request_id) is None:
            return
        tree = self._tree_of(failed.conversation_id)
        if tree is not None and failed.reply_id in tree:
            reply = tree.node(failed.reply_id)
            if not reply.text:
                removed = tree.delete_branch(reply.id)  # nothing was said: no empty reply
                self._save([], deleted=removed, conversation_id=failed.conversation_id)
            else:
                reply.status = NodeStatus.INTERRUPTED
                self._save([reply], conversation_id=failed.conversation_id)
        self._end_reply()
        if failed.message:
            QMessageBox.warning(self, "Arbor", failed.message)
        else:
            self.statusBar().showMessage("Stopped.", 4000)

    @Slot(object)
    def _on_plan(self, plan: Plan) -> None:
        if self._answering(plan.request_id) is not None:
            self._plan = plan

    def _plan_text(self, total: int) -> str:
        plan = self._plan
        if plan is None or plan.source == "none":
            return f"Reading the conversation from the start: {total:,} tokens"
        where = ("restored checkpoint" if plan.source == "checkpoint"
                 else "kept the cache")
        return (f"{where} at {plan.reused_tokens:,} of {plan.prompt_tokens:,} tokens, "
                f"decoding {plan.prompt_tokens - plan.reused_tokens:,}")

    # --- warming: the likely next prompt, prepared while the user reads -----------------------

    def _schedule_warm(self) -> None:
        if self._model is not None and self._streaming is None:
            self._warm_timer.start()

    @Slot(int)
    def _on_edit_started(self, node_id: int) -> None:
        self._editing = node_id
        self._schedule_warm()

    @Slot(int)
    def _on_edit_cancelled(self, _node_id: int) -> None:
        self._editing = None

    def warm_path(self) -> list[Node]:
        """What the next prompt will most likely start with: the parent of the message being
        edited, or the active branch (a reply, re-decoded in one batch; see Runtime)."""
        if self.current is None:
            return []
        tree = self.tree
        if self._editing is not None and self._editing in tree:
            parent = tree.node(self._editing).parent
            return tree.path_to(parent) if parent is not None else []
        path = tree.path_to(tree.active_leaf)
        if any(node.status is not NodeStatus.COMPLETE for node in path):
            return []  # an interrupted reply is continued from its own open tokens
        return path

    @Slot()
    def _warm_now(self) -> None:
        if self._model is None or self._streaming is not None or self.current is None:
            return
        path = self.warm_path()
        cid = self.current
        key = tuple(global_id(cid, node.id) for node in path)
        if not path or key == self._warmed_path:
            return
        self._warmed_path = key
        if self.progress.isHidden():
            self.progress_label.clear()  # "ready" was about another branch
        self.request_warm.emit(WarmRequest(self.worker.epoch, cid,
                                           tuple(_global_view(cid, n) for n in path)))

    @Slot(object)
    def _on_warmed(self, warmed: Warmed) -> None:
        tree = self._tree_of(warmed.conversation_id)
        if tree is not None:
            # What the warm-up rendered is what those nodes keep: the request that follows
            # finds them rendered (a template with the date in it cannot move them).
            adopted = _adopt_tokens(tree, warmed.node_tokens)
            if adopted and not self._save(adopted, conversation_id=warmed.conversation_id):
                for node in adopted:
                    node.tokens = None
        # On the line above the composer, not the status bar: that keeps the last step's
        # figures. The next request's plan replaces it.
        if (self._streaming is None and self.progress.isHidden()
                and warmed.conversation_id == self.current and warmed.prompt_tokens):
            self.progress_label.setText(
                f"Ready: {warmed.prompt_tokens:,} tokens prepared; the next message decodes "
                "only itself.")
        self.warmed.emit(warmed)

    def _end_reply(self) -> None:
        self._streaming = None
        self._update_send_button()
        self.progress.setVisible(False)
        self.progress_label.clear()
        self.sidebar.set_generating(None)
        self._refresh_views()
        self.reply_finished.emit()
        pending, self._pending_edit = self._pending_edit, None
        if pending is not None:
            cid, node_id, text = pending
            if cid in self.conversations and node_id in self.conversations[cid].tree:
                self.open_conversation(cid)
                self.edit(node_id, text)
                return
        self._schedule_warm()

    # --- helpers -------------------------------------------------------------------------------

    def _tree_of(self, conversation_id: int) -> Tree | None:
        """The tree of an open conversation, if it is open."""
        conversation = self.conversations.get(conversation_id)
        return conversation.tree if conversation is not None else None

    def _save(self, nodes: list[Node], *, deleted: list[int] | tuple[int, ...] = (),
              conversation_id: int | None = None) -> bool:
        cid = conversation_id if conversation_id is not None else self.current
        assert cid is not None
        tree = self.conversations[cid].tree
        return self._attempt(lambda: self.store.save(cid, tree, nodes, deleted=deleted))

    def _drop_unsaved(self, node: Node, leaf: int) -> None:
        """A node the store refused (disk full, say) leaves the tree too: what the window
        shows is always what is saved."""
        self.tree.delete_branch(node.id)
        if leaf in self.tree:
            self.tree.set_active(leaf)
        self._refresh_views()

    def _attempt(self, action: Callable[[], object]) -> bool:
        """Run a store action; a failure is one message to the user (and False), never a
        traceback."""
        try:
            action()
        except ArborError as exc:
            QMessageBox.warning(self, "Arbor", str(exc))
            return False
        return True

    def _fetch(self, action: Callable[[], T]) -> T | None:
        """Run a store action that returns a value; None (and one message) if it failed."""
        try:
            return action()
        except ArborError as exc:
            QMessageBox.warning(self, "Arbor", str(exc))
            return None

    def _refresh_views(self) -> None:
        if self.current is None or self.current not in self.conversations:
            return
        tree = self.tree
        marks = self._checkpoint_nodes.get(self.current, {})
        self.chat.model().set_rows(rows_from_tree(tree, marks))
        self.tree_panel.set_tree(panel_nodes_from_tree(tree, marks),
                                 [n.id for n in tree.active_path()])
        self._update_send_button()
        self._schedule_warm()

    # --- import / export -------------------------------------------------------------------

    @Slot()
    def _import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import", str(Path.home()),
            "Conversations (*.arbor *.json);;All files (*)")
        if path:
            self.import_path(Path(path))

    def _make_importer(self) -> Importer:
        """The file is read and committed on the importer's thread, over its own connection
        to this store's database; the window then shows the new conversations."""
        importer = Importer(self.store.path, self)
        importer.imported.connect(self._on_imported)
        importer.rejected.connect(self._on_import_rejected)
        return importer

    def import_path(self, path: Path) -> bool:
        """Start importing `path` and return at once; `import_finished` follows. False when
        another import is still being read (one at a time: the user is told, nothing queues)."""
        current = self.importer.current_path
        if current is not None:
            self.statusBar().showMessage(
                f"Still reading {current.name}; import {path.name} once it is done.", 6000)
            return False
        identity = self._model.identity if self._model is not None else None
        if not self.importer.start(path, identity):
            return False
        self.statusBar().showMessage(f"Reading {path.name}…")
        return True

    @Slot(object)
    def _on_imported(self, parsed: ImportedFile) -> None:
        result = parsed.result
        self._refresh_sidebar()
        if result.conversation_ids:
            self.open_conversation(result.conversation_ids[0])
        carried = parsed.contents.checkpoints
        note = ""
        if carried:  # verified against the loaded model's identity while parsing
            self.request_adopt.emit(AdoptCheckpoints(
                carried[0].identity, tuple(item.checkpoint for item in carried)))
            note = f" with {len(carried)} checkpoints"
        elif parsed.contents.dropped_checkpoints:
            note = (f"; its {parsed.contents.dropped_checkpoints} checkpoints were made for "
                    "another model or context and were left out")
        self.statusBar().showMessage(
            f"Imported {len(result.conversation_ids)} conversations{note}.")
        self.import_finished.emit(result.conversation_ids)

    @Slot(object)
    def _on_import_rejected(self, rejected: RejectedFile) -> None:
        self.statusBar().clearMessage()
        QMessageBox.warning(self, "Arbor",
                            f"{rejected.path.name} was not imported.\n\n{rejected.message}")
        self.import_finished.emit([])

    def _export(self, fmt: FileFormat) -> None:
        if self.current is None:
            return
        suffix = {FileFormat.NATIVE: "arbor", FileFormat.CHATGPT: "json",
                  FileFormat.MARKDOWN: "md", FileFormat.OPENAI: "json"}[fmt]
        path, _ = QFileDialog.getSaveFileName(self, "Export", f"conversation.{suffix}")
        if path:
            self.export_current(Path(path), fmt)

    def export_current(self, path: Path, fmt: FileFormat) -> None:
        """A session file is written on the engine thread, with the conversation's
        checkpoints (`export_finished` follows); the other formats are written here."""
        if self.current is None:
            return
        cid = self.current
        if fmt is FileFormat.NATIVE:
            record = self._fetch(lambda: self.store.record(cid))
            if record is not None:
                self.statusBar().showMessage(f"Writing {path.name}…")
                self.request_export.emit(ExportRequest(str(path), cid, (record,)))
            return
        if self._attempt(lambda: export_file(self.store, [cid], path, fmt)):
            self.statusBar().showMessage(f"Exported to {path}.", 6000)

    @Slot(object)
    def _on_exported(self, done: ExportDone) -> None:
        name = Path(done.path).name
        if done.error is not None:
            QMessageBox.warning(self, "Arbor", f"{name} was not exported: {done.error}")
        else:
            self.statusBar().showMessage(
                f"Exported to {done.path} with {done.checkpoints} checkpoints.", 6000)
        self.export_finished.emit(done)

    # --- lifetime ----------------------------------------------------------------------------

    def _restore_geometry(self) -> None:
        settings = QSettings(str(data_dirs().config / "window.ini"), QSettings.Format.IniFormat)
        geometry = settings.value("geometry")
        state = settings.value("state")
        splitter = settings.value("splitter")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        if isinstance(state, QByteArray):
            self.restoreState(state)
        if isinstance(splitter, QByteArray):
            self.splitter.restoreState(splitter)

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self._thread.isRunning():  # closed before: everything is released
            super().closeEvent(event)
            return
        settings = QSettings(str(data_dirs().config / "window.ini"), QSettings.Format.IniFormat)
        settings.setValue("geometry", self.saveGeometry())
        settings.setValue("state", self.saveState())
        settings.setValue("splitter", self.splitter.saveState())
        self.worker.request_stop()
        self.worker.preempt()  # and any warm-up
        self._warm_timer.stop()
        streaming = self._streaming
        if streaming is not None:
            tree = self._tree_of(streaming.conversation_id)
            if tree is not None and streaming.reply_id in tree:
                reply = tree.node(streaming.reply_id)
                reply.status = NodeStatus.INTERRUPTED
                self._save([reply], conversation_id=streaming.conversation_id)
            self._streaming = None
        # Wait (stop was requested: at most a chunk or a token) for the worker to free the
        # model on its own thread, then end the thread: no "QThread destroyed while running".
        QMetaObject.invokeMethod(self.worker, "shutdown",
                                 Qt.ConnectionType.BlockingQueuedConnection)
        self._thread.quit()
        self._thread.wait()
        self.importer.shutdown()  # before the store closes: an abandoned parse commits nothing
        self.store.close()
        super().closeEvent(event)


def _adopt_tokens(tree: Tree, rendered: tuple[tuple[int, tuple[int, ...]], ...]) -> list[Node]:
    """Give nodes that still have no tokens the ones the engine rendered for them."""
    changed: list[Node] = []
    for key, tokens in rendered:
        _, nid = split_id(key)
        if nid in tree and tree.node(nid).tokens is None:
            tree.node(nid).tokens = tokens
            changed.append(tree.node(nid))
    return changed


def _global_view(conversation_id: int, node: Node) -> NodeView:
    view = NodeView.of(node)
    return replace(view, id=global_id(conversation_id, view.id))
