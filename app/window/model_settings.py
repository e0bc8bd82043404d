"""Models and settings: the model picker, Open GGUF, the settings dialog, and what applying a
choice costs (at once, a reload of the model, or a reload after which the saved checkpoints no
longer fit). The chosen settings are saved before the engine sees them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox, QWidget

from app.dialogs.model_picker import ModelPicker
from app.dialogs.settings_dialog import SettingsDialog
from app.look.theme import apply_theme
from app.state.controller import ChatController
from app.state.hub_jobs import Downloads, HubJobs
from app.window.status import StatusArea
from engine.config.settings import Effect, Settings, SettingsError, effect_of, save_settings
from engine.files.paths import data_dirs
from engine.service.protocol import ConfigureRequest


class ModelSettings(QObject):
    settings_applied = Signal()

    def __init__(self, controller: ChatController, status: StatusArea, window: QWidget) -> None:
        super().__init__(window)
        self.controller = controller
        self.replies = controller.replies
        self.status = status
        self.window = window
        self.replies.model_ready.connect(self._remember_model)
        # The session's hub search and downloads (the window sets them): Discover's.
        self.jobs: HubJobs | None = None
        self.downloads: Downloads | None = None

    @property
    def settings(self) -> Settings:
        return self.controller.settings

    def load_model(self, path: str) -> None:
        self.replies.load(path)

    @Slot()
    def _remember_model(self) -> None:
        """The last model loaded is loaded on the next start."""
        model = self.replies.model
        if model is not None and self.settings.model != model.path:
            self._save(replace(self.settings, model=model.path), send=False, automatic=True)

    @Slot()
    def open_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open GGUF model",
                                              str(data_dirs().models), "GGUF models (*.gguf)")
        if path:
            self.load_model(path)

    def picker(self, discover: bool = False) -> ModelPicker:
        """The picker, with what the engine knows (the chat templates it names, the GPUs'
        memory for Discover's fit); `discover`: on its Discover tab."""
        loaded = self.replies.model.path if self.replies.model is not None else None
        picker = ModelPicker(loaded, self.window, settings=self.settings,
                             builtin=self.replies.builtin_templates, jobs=self.jobs,
                             downloads=self.downloads, free_vram=self.replies.free_vram)
        if discover and picker.discover is not None:
            picker.tabs.setCurrentWidget(picker.discover)
        return picker

    @Slot()
    def pick_model(self, discover: bool = False) -> None:
        """The picker; `discover`: open on its Discover tab."""
        picker = self.picker(discover)
        if picker.exec() == ModelPicker.DialogCode.Accepted:
            chosen = picker.chosen()
            if chosen is not None:
                self.choose_model(chosen, picker.chosen_template())
        picker.deleteLater()

    def choose_model(self, path: Path, template: str | None) -> None:
        """Load `path`, with `template` (None: automatic) for its new messages. A new
        template for the loaded model applies at once, without loading it again."""
        updated = self.settings.with_template(path, template)
        model = self.replies.model
        if model is not None and Path(model.path) == path and updated != self.settings:
            self.apply_settings(updated)  # the engine renders new messages with it
            return
        if updated != self.settings and not self._save(updated, send=False):
            return
        self.load_model(str(path))

    @Slot()
    def edit_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self.window)
        if dialog.exec() == SettingsDialog.DialogCode.Accepted:
            try:
                saved = dialog.token.save()
            except (ValueError, OSError) as exc:  # never the token itself in the message
                QMessageBox.warning(self.window, "Arbor", f"The token was not saved: {exc}")
            else:
                if saved:
                    self.status.message(saved, 8000)
            try:
                chosen = dialog.chosen()
            except SettingsError as exc:  # the OK button is disabled for these; belt and braces
                QMessageBox.warning(self.window, "Arbor", str(exc))
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
        if not self._save(settings, send=True):
            return Effect.NONE
        app = QApplication.instance()
        if theme_changed and isinstance(app, QApplication):
            apply_theme(app, settings.theme)
        if effect is Effect.INVALIDATE:
            self.status.message(
                "New context settings: the saved checkpoints do not fit them, so the next "
                "reply in each conversation reads it from the start.", 12_000)
        elif effect is Effect.RELOAD:
            self.status.message("Loading the model again with the new settings…", 8000)
        if effect in (Effect.RELOAD, Effect.INVALIDATE) and self.replies.model is not None:
            self.replies.model = None  # replies wait for the reload
            self.status.show_busy("Loading the model again…")
        self.settings_applied.emit()
        return effect

    def _save(self, settings: Settings, *, send: bool, automatic: bool = False) -> bool:
        """`automatic`: not asked for by the user, so a settings file that was set aside is
        left for the user to mend (the settings still apply for this session)."""
        try:
            save_settings(settings, automatic=automatic)
        except SettingsError as exc:
            QMessageBox.warning(self.window, "Arbor", str(exc))
            return False
        self.controller.settings = settings
        self.controller.tools.configure(settings.mcp_servers)
        if send:
            self.replies.send(ConfigureRequest(settings))
        return True
