"""Arbor's main window: it lays out the parts and connects them, and decides nothing.

- `ChatController` (app.state.controller): the open conversations and every operation on them,
  through the Qt-free core; `Replies` (app.state.replies): the engine's side (the model, the reply
  in progress, warm-ups) over a `QtEngine` (app.state.engine_client): the engine in a process
  of its own, which owns llama.cpp.
- `StatusArea` (app.window.status): every line about what the engine is doing.
- `FileActions` (app.window.files) and `ModelSettings` (app.window.model_settings): the dialogs.
- `app.look.actions`: every action's text, keys, icon, menu and when it is enabled.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, Qt, QUrl, Signal, Slot
from PySide6.QtGui import QAction, QCloseEvent, QDesktopServices, QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (
    QDialog,
    QDockWidget,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.chat.attachment_strip import AttachmentStrip
from app.chat.chat_model import rows_from_tree
from app.chat.chat_view import ChatView
from app.chat.composer import Composer, local_files
from app.dialogs.conversation_settings import ConversationSettingsDialog
from app.dialogs.tool_picker import ToolPicker
from app.look.actions import (
    ACTIONS,
    TOOLBAR,
    Menu,
    Scope,
    When,
    apply_icons,
    make_actions,
    shortcut_rows,
    spec,
)
from app.look.icons import icon
from app.look.theme import theme_events
from app.state.api_server import AppApi
from app.state.attachments import Attachments
from app.state.controller import ChatController
from app.state.engine_client import ProcessEngine, QtEngine
from app.state.hub_jobs import Downloads, HubJobs
from app.tree.tree_panel import TreePanel, panel_nodes_from_tree
from app.window.context_gauge import CHARS_PER_TOKEN, ContextGauge
from app.window.downloads_status import DownloadsStatus
from app.window.files import FileActions
from app.window.message_bar import MessageBar
from app.window.model_settings import ModelSettings
from app.window.sidebar import Sidebar
from app.window.status import StatusArea
from app.window.tool_approval import ApprovalBar
from engine.config.settings import Settings, load_settings
from engine.core.attachments import Document
from engine.core.tools import TOOL_SERVERS, tools_of
from engine.core.tree import Tree
from engine.files.documents import SUFFIXES
from engine.files.paths import data_dirs
from engine.storage.store import Store
from engine.storage.transfer import FileFormat

log = logging.getLogger(__name__)
# The chat's message actions whose keys also work in the composer, on the last message.
COMPOSER_ACTIONS = ("edit", "regenerate", "copy", "copy_code", "toggle_reasoning",
                    "previous_variant", "next_variant")


class MainWindow(QMainWindow):
    # Emitted on the GUI thread once an engine result is applied (tests and other widgets
    # wait on these).
    reply_finished = Signal()
    model_ready = Signal()
    model_failed = Signal()
    text_shown = Signal()
    warmed = Signal(object)  # Warmed, once applied

    def __init__(
        self,
        *,
        store: Store | None = None,
        settings: Settings | None = None,
        engine: QtEngine | None = None,
    ) -> None:
        """`engine`: the app's is a `ProcessEngine` (the default); tests and the benchmark
        may pass a `ThreadEngine`."""
        super().__init__()
        self.setWindowTitle("Arbor")
        self.resize(1200, 800)
        self.store = store or Store()
        # The program passes the settings it loaded (and reported a bad file for).
        settings = settings if settings is not None else load_settings().settings
        self.engine = engine if engine is not None else ProcessEngine()
        self.engine.setParent(self)
        self.controller = ChatController(self.store, settings, self.engine, self)
        self._models_declined: set[tuple[int, str]] = set()  # (conversation, model) said no
        self.replies = self.controller.replies

        self.sidebar = Sidebar()
        self.chat = ChatView()
        self.composer = Composer()
        self.composer.setMaximumHeight(120)
        self.attachments = Attachments(self)
        self.attachment_strip = AttachmentStrip()
        self.composer.sendable_empty = lambda: bool(self.attachments.documents)
        self.attach_button = QPushButton()
        self.attach_button.setToolTip("Attach documents (Ctrl+Shift+A): text, Markdown, code, "
                                      "HTML, PDF, DOCX. Or drop them here.")
        self.attach_button.setAccessibleName("Attach documents")
        self.setAcceptDrops(True)  # a file dropped anywhere in the window is attached
        self.send_button = QPushButton("Send")
        self.tree_panel = TreePanel()
        self.approval = ApprovalBar(self.controller.tools)
        self.setStatusBar(MessageBar(self))  # elides its message instead of clipping it
        self.status = StatusArea(self.replies, self.statusBar())
        self.progress_label = self.status.label
        self.status_model = self.status.model_label
        self.files = FileActions(self.controller, self.status, self)
        self.models = ModelSettings(self.controller, self.status, self)
        self.api = AppApi(self.controller, self)
        self.context_bar = QProgressBar()
        self.context_gauge = ContextGauge(self.controller, self.context_bar)
        self.statusBar().addPermanentWidget(self.context_bar)
        self.hub_jobs = HubJobs(parent=self)
        self.downloads = Downloads(data_dirs().models, parent=self)
        self.models.jobs, self.models.downloads = self.hub_jobs, self.downloads
        self.downloads_status = DownloadsStatus(self.downloads, self.status, self.statusBar())
        self.downloads_status.open_requested.connect(lambda: self.models.pick_model(True))
        self.downloads_status.offer_unfinished()
        self._build_layout()
        self.actions_by_name = make_actions(Scope.WINDOW, self, self._slots())
        self._build_menus()
        self._connect()
        self._composer_keys()
        self._restore_geometry()
        self.controller.open_first()
        self.api.apply(settings)

    # --- state the tests and the program read -----------------------------------------------

    @property
    def settings(self) -> Settings:
        return self.controller.settings

    @property
    def current(self) -> int | None:
        return self.controller.current

    @property
    def tree(self) -> Tree:
        return self.controller.tree

    # --- layout ------------------------------------------------------------------------------

    def _build_layout(self) -> None:
        row = QHBoxLayout()
        row.addWidget(self.attach_button)
        row.addWidget(self.composer)
        row.addWidget(self.send_button)
        center = QWidget()
        column = QVBoxLayout(center)
        column.addWidget(self.chat, 1)
        column.addWidget(self.status.label)
        column.addWidget(self.status.progress)
        column.addWidget(self.approval)
        column.addWidget(self.attachment_strip)
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

    def _slots(self) -> dict[str, Callable[[], object]]:
        c, files, models = self.controller, self.files, self.models
        return {
            "new": c.new_conversation, "models": models.pick_model,
            "open_model": models.open_model, "import": files.ask_import,
            "export_native": lambda: files.ask_export(FileFormat.NATIVE),
            "export_chatgpt": lambda: files.ask_export(FileFormat.CHATGPT),
            "export_markdown": lambda: files.ask_export(FileFormat.MARKDOWN),
            "settings": models.edit_settings, "quit": self.close, "undo": c.undo,
            "stop": self._stop, "continue": c.continue_reply,
            "regenerate_last": c.regenerate, "system": self._system_prompt_dialog,
            "conversation_settings": self._conversation_settings_dialog,
            "rename": lambda: self._rename(c.current),
            "delete_conversation": self._delete_current,
            "tree": lambda: self.tree_dock.setVisible(self.actions_by_name["tree"].isChecked()),
            "search": self._focus_search, "composer": self.composer.setFocus,
            "attach": self._ask_attach,
            "messages": self.chat.setFocus, "tree_nodes": self._focus_tree,
            "next_conversation": lambda: c.step_conversation(1),
            "previous_conversation": lambda: c.step_conversation(-1),
            "shortcuts": self._show_shortcuts,
            "log_folder": self._open_log_folder,
        }

    def _build_menus(self) -> None:
        actions = {**self.actions_by_name, **self.chat.actions_by_name}
        menus = {menu: self.menuBar().addMenu(menu.value) for menu in Menu}
        for item in ACTIONS:
            if item.menu is None:
                continue
            if item.separator:
                menus[item.menu].addSeparator()
            menus[item.menu].addAction(actions[item.name])
        toolbar = self.addToolBar("Main")
        toolbar.setObjectName("main-toolbar")
        for name in TOOLBAR:
            if name is None:
                toolbar.addSeparator()
            else:
                toolbar.addAction(actions[name])
        self.tree_dock.visibilityChanged.connect(self.actions_by_name["tree"].setChecked)
        self._apply_icons()
        theme_events.changed.connect(self._apply_icons)
        self._update_actions()

    def _composer_keys(self) -> None:
        """The keys of the chat's message actions that a text box has no use for (Ctrl+R,
        Ctrl+E, F2, Alt+Left/Right, Ctrl+Shift+C...) work in the composer too, on the last
        message: a user who has just read a reply regenerates it without leaving the box.
        Keys that edit text there (Delete, Ctrl+Backspace) stay the text box's."""
        names = COMPOSER_ACTIONS if sys.platform != "darwin" else tuple(
            n for n in COMPOSER_ACTIONS if not n.endswith("_variant"))  # Option+arrows: words
        for name in names:
            proxy = QAction(self.composer)
            proxy.setShortcuts(self.chat.action(name).shortcuts())
            proxy.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
            proxy.triggered.connect(lambda _checked=False, n=name: self._on_last_message(n))
            self.composer.addAction(proxy)

    def _on_last_message(self, name: str) -> None:
        model = self.chat.model()
        count = model.rowCount()
        if not count:
            return
        self.chat.setCurrentIndex(model.index(count - 1))
        action = self.chat.action(name)
        if action.isEnabled():
            action.trigger()

    @Slot()
    def _apply_icons(self) -> None:
        apply_icons(self.actions_by_name)
        apply_icons(self.chat.actions_by_name)
        self.attach_button.setIcon(icon("attach"))
        self._update_send_button()

    def _connect(self) -> None:
        c, r = self.controller, self.replies
        self.models.settings_applied.connect(lambda: self.api.apply(c.settings))
        self.api.changed.connect(lambda: self.status.show_api(self.api.url, self.api.problem))
        self.sidebar.opened.connect(c.open_conversation)
        self.sidebar.new_requested.connect(c.new_conversation)
        self.sidebar.rename_requested.connect(self._rename)
        self.sidebar.delete_requested.connect(c.delete_conversation)
        self.sidebar.search_changed.connect(self._refresh_sidebar)
        self.composer.submitted.connect(self._send)
        self.composer.stop_requested.connect(self._stop)
        self.composer.files_given.connect(self.attachments.add)
        self.attach_button.clicked.connect(self._ask_attach)
        self.attachments.changed.connect(lambda: self.attachment_strip.show_state(
            self.attachments.documents, self.attachments.reading))
        self.attachments.refused.connect(self._on_attachment_refused)
        self.attachments.too_long.connect(self._on_document_too_long)
        self.attachments.room = self.context_gauge.document_room
        self.attachment_strip.removed.connect(self.attachments.remove)
        self.attachment_strip.cancel_requested.connect(self.attachments.cancel)
        self.send_button.clicked.connect(self._on_send_clicked)
        self.chat.variant_requested.connect(c.switch_variant)
        self.chat.edit_submitted.connect(c.edit)
        self.chat.edit_started.connect(r.start_editing)
        self.chat.edit_cancelled.connect(self._on_edit_cancelled)
        self.chat.regenerate_requested.connect(c.regenerate)
        self.chat.rewind_requested.connect(self._rewind)
        self.chat.fork_requested.connect(c.fork)
        self.chat.delete_requested.connect(c.delete_branch)
        self.tree_panel.node_clicked.connect(c.activate_node)
        c.changed.connect(self._refresh_views)
        c.listed.connect(self._refresh_sidebar)
        c.focus_node.connect(self.chat.show_node)
        self.chat.notice.connect(self.status.message)
        c.notice.connect(self.status.message)
        c.error.connect(self._show_error)
        c.model_wanted.connect(self._offer_model)
        r.model_ready.connect(self.model_ready)
        r.model_failed.connect(self._on_model_failed)
        r.streaming_changed.connect(self._on_streaming_changed)
        r.piece_shown.connect(self._on_piece_shown)
        r.reply_finished.connect(self.reply_finished)
        r.reply_failed.connect(self._on_reply_failed)
        r.warmed.connect(self.warmed)
        r.engine_lost.connect(self._show_error)

    # --- what the window shows ---------------------------------------------------------------

    @Slot()
    def _refresh_views(self) -> None:
        c = self.controller
        if c.current is None or c.current not in c.conversations:
            return
        tree = c.tree
        marks = self.replies.marks.get(c.current, {})
        self.chat.model().set_rows(rows_from_tree(tree, marks), c.current)
        self.tree_panel.set_tree(panel_nodes_from_tree(tree, marks),
                                 [n.id for n in tree.active_path()])
        self._update_actions()
        self.replies.schedule_warm()

    @Slot()
    def _refresh_sidebar(self, query: str | None = None) -> None:
        conversations, hits = self.controller.listing(
            self.sidebar.search.text() if query is None else query)
        self.sidebar.show_conversations(conversations, self.controller.current, hits)

    @Slot()
    def _on_streaming_changed(self) -> None:
        streaming = self.replies.streaming
        self.sidebar.set_generating(streaming.conversation_id if streaming else None)
        self._update_send_button()
        self._update_actions()

    def _update_send_button(self) -> None:
        streaming = self.replies.streaming is not None
        self.send_button.setText("Stop" if streaming else "Send")
        self.send_button.setIcon(icon("stop" if streaming else "send"))

    def _update_actions(self) -> None:
        state = {When.ALWAYS: True, When.CAN_UNDO: self.controller.can_undo,
                 When.ANSWERING: self.replies.streaming is not None,
                 When.IDLE: self.replies.streaming is None and self.replies.model is not None}
        for name, action in self.actions_by_name.items():
            action.setEnabled(state[spec(name).when])

    @Slot(int, str, str)
    def _on_piece_shown(self, node_id: int, text: str, status: str, opened: bool) -> None:
        self.chat.model().update_text(node_id, text, status, opened)
        self.text_shown.emit()

    @Slot(str)
    def _show_error(self, message: str) -> None:
        QMessageBox.warning(self, "Arbor", message)

    @Slot(str)
    def _on_model_failed(self, message: str) -> None:
        QMessageBox.warning(self, "Arbor", f"The model could not be loaded.\n\n{message}")
        self.model_failed.emit()

    @Slot(str)
    def _on_reply_failed(self, message: str) -> None:
        QMessageBox.warning(self, "Arbor", message)

    # --- small interactions ------------------------------------------------------------------

    @Slot(str)
    def _send(self, text: str) -> None:
        documents = self.attachments.take()
        if self.controller.send(text, documents):
            self.composer.clear()
        else:
            self.attachments.give_back(documents)

    @Slot()
    def _ask_attach(self) -> None:
        names = " ".join(f"*{suffix}" for suffix in sorted(SUFFIXES))
        paths, _filter = QFileDialog.getOpenFileNames(
            self, "Attach documents", "", f"Documents ({names});;All files (*)")
        if paths:
            self.attachments.add([Path(p) for p in paths])

    @Slot(object, int)
    def _on_document_too_long(self, document: Document, room: int) -> None:
        """A document longer than the context: never cut silently; the user chooses."""
        tokens = len(document.text) // CHARS_PER_TOKEN
        box = QMessageBox(QMessageBox.Icon.Question, "Arbor",
                          f"{document.name} is about {tokens:,} tokens: more than this "
                          f"conversation has room for (about {room // CHARS_PER_TOKEN:,}).",
                          parent=self)
        box.setInformativeText(
            "Give the model its start (what fits, cut at a line), or search it: each message "
            "then reads the passages of the document that best match it.")
        start = box.addButton("Attach its start", QMessageBox.ButtonRole.AcceptRole)
        search = box.addButton("Search it", QMessageBox.ButtonRole.AcceptRole)
        box.addButton("Don't attach", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(search)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.buttonClicked.connect(lambda button: self._document_chosen(
            document, room, "start" if button == start else "search" if button == search
            else None))
        box.open()  # window-modal, never a nested event loop

    def _document_chosen(self, document: Document, room: int, how: str | None) -> None:
        if how == "start":
            self.attachments.keep(document.start(room))
        elif how == "search":
            self.attachments.keep(document.searched(room))
        else:
            self.status.message(f"{document.name} was not attached")

    @Slot(str)
    def _on_attachment_refused(self, message: str) -> None:
        self.status.message(message)
        QMessageBox.warning(self, "Arbor", message)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if local_files(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        files = local_files(event.mimeData())
        if files:
            event.acceptProposedAction()
            self.attachments.add(files)

    @Slot()
    def _stop(self) -> None:
        """Stop the reply, or the tool loop (the calls not run stay unanswered)."""
        self.replies.stop()
        self.controller.tools.cancel()

    @Slot()
    def _on_send_clicked(self) -> None:
        if self.replies.streaming is not None:
            self.replies.stop()
        elif (text := self.composer.toPlainText().strip()) or self.attachments.documents:
            self._send(text)

    @Slot(int)
    def _rewind(self, node_id: int) -> None:
        self.controller.rewind(node_id)
        self.composer.setFocus()

    @Slot(int)
    def _on_edit_cancelled(self, _node_id: int) -> None:
        self.replies.editing = None

    @Slot(int)
    def _rename(self, conversation_id: int | None) -> None:
        if conversation_id is None:
            return
        title, ok = QInputDialog.getText(self, "Rename", "Title:")
        if ok:
            self.controller.rename(conversation_id, title)

    def _delete_current(self) -> None:
        if self.controller.current is not None:
            self.controller.delete_conversation(self.controller.current)

    def _system_prompt_dialog(self) -> None:
        if self.controller.current is None:
            return
        text, ok = QInputDialog.getMultiLineText(
            self, "System prompt", "Instructions for the model in this conversation "
            "(empty: the model's own default):", self.tree.root.text)
        if ok:
            self.controller.set_system_prompt(text.strip())

    def _conversation_settings_dialog(self) -> None:
        if self.controller.current is None:
            return
        root = self.controller.tree.root
        servers = root.meta.get(TOOL_SERVERS)
        picker = ToolPicker(self.controller.tools.hub, self.settings.mcp_servers,
                            tools_of(root.meta) or [],
                            servers if isinstance(servers, dict) else {})
        dialog = ConversationSettingsDialog(self.controller.overrides(), self.settings,
                                            self.replies.model_path, self, tools=picker)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.controller.set_tools(*picker.chosen())
            chosen = dialog.chosen()
            if self.controller.set_overrides(chosen) and chosen.model is not None \
                    and chosen.model != self.replies.model_path:
                self._offer_model(chosen.model)

    @Slot(str)
    def _offer_model(self, path: str) -> None:
        """The conversation was set to another model than the loaded one: offer to load it
        (once per conversation and session, if the user says no)."""
        cid = self.controller.current
        if cid is None or (cid, path) in self._models_declined:
            return
        name = Path(path).name
        if not Path(path).is_file():
            self.status.message(
                f"This conversation was set to {name}, which is not there any more; the "
                "loaded model answers.", 8000)
            return
        answer = QMessageBox.question(
            self, "Load this conversation's model?",
            f"This conversation uses {name}. Load it now? Loading takes a few seconds; the "
            "other conversations then answer with it too until another model is loaded, and "
            "each model's checkpoints are kept apart (none is lost).")
        if answer == QMessageBox.StandardButton.Yes:
            self.models.load_model(path)
        else:
            self._models_declined.add((cid, path))

    def _focus_tree(self) -> None:
        self.tree_dock.setVisible(True)
        self.tree_panel.setFocus()

    def _focus_search(self) -> None:
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    def shortcut_table(self) -> list[tuple[str, str]]:
        """(action, keys) for every action with a shortcut, in menu order."""
        return shortcut_rows()

    def _show_shortcuts(self) -> None:
        rows = "".join(f"<tr><td>{name}</td><td><b>{keys}</b></td></tr>"
                       for name, keys in self.shortcut_table())
        box = QMessageBox(QMessageBox.Icon.NoIcon, "Keyboard shortcuts",
                          f"<table cellspacing='6'>{rows}</table>", parent=self)
        box.exec()
        box.deleteLater()

    # --- lifetime ----------------------------------------------------------------------------

    def _window_ini(self) -> QSettings:
        return QSettings(str(data_dirs().config / "window.ini"), QSettings.Format.IniFormat)

    def _restore_geometry(self) -> None:
        settings = self._window_ini()
        for key, restore in (("geometry", self.restoreGeometry), ("state", self.restoreState),
                             ("splitter", self.splitter.restoreState)):
            value = settings.value(key)
            if isinstance(value, QByteArray):
                restore(value)

    def _open_log_folder(self) -> None:
        folder = data_dirs().logs
        folder.mkdir(parents=True, exist_ok=True)
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            self.status.message(f"The logs are in {folder}", 15_000)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.attachments.shutdown()  # the reads going on are cancelled, their threads ended
        if not self.engine.running:  # closed before: everything is released
            super().closeEvent(event)
            return
        settings = self._window_ini()
        settings.setValue("geometry", self.saveGeometry())
        settings.setValue("state", self.saveState())
        settings.setValue("splitter", self.splitter.saveState())
        streaming = self.replies.streaming
        if streaming is not None:  # saved as interrupted: it can be continued next time
            self.replies.interrupt(streaming)
            self.replies.streaming = None
        self.api.stop()  # its clients get an error; its replies stop
        # Stop (at most a chunk or a token), free the model on its own thread, end it.
        self.engine.shutdown()
        self.files.shutdown()  # before the store closes: an abandoned parse commits nothing
        self.downloads.close()  # parts are kept: the next start offers them
        self.hub_jobs.close()
        self.controller.tools.close()  # stops the MCP servers it started
        self.store.close()
        super().closeEvent(event)
