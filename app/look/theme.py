"""Light and dark themes: the Fusion style with a palette that follows the system or the user.

Arbor paints its own bubbles and graph from the palette, so the palette is the whole theme.
Fusion is used on every platform because it draws every control from the palette (native
styles on Windows and macOS ignore parts of a custom dark palette and end up half light).

`apply_theme(app, ThemeChoice.SYSTEM)` follows `QStyleHints.colorScheme()` and re-applies
itself when the system switches; LIGHT and DARK pin the palette. After every application
of a palette, the rendered icon cache is cleared and `theme_events.changed` is emitted, so
the main window can fetch its icons again (`app.look.icons.icon` bakes colours in).
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt, Signal, Slot
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from app.look.icons import clear_icon_cache
from engine.config.settings import Theme

log = logging.getLogger(__name__)

STYLE = "Fusion"

# WCAG's minimum contrast for body text; the dark palette meets it for every text role.
MIN_TEXT_CONTRAST = 4.5


# Pygments styles for code blocks: familiar colour schemes, each colour moved in lightness
# where needed to be readable on the bubbles (app.chat.code_blocks.readable).
LIGHT_CODE_STYLE = "default"
DARK_CODE_STYLE = "github-dark"


# The choice is a setting (engine.config.settings.Theme: system, light, dark), saved with the
# others.
ThemeChoice = Theme


class ThemeEvents(QObject):
    """Tells the GUI that a palette was applied; `changed` carries whether it is dark."""

    changed = Signal(bool)


theme_events = ThemeEvents()


class _Follower(QObject):
    """Holds the current choice and re-applies it when the system colour scheme changes.

    A QObject (not a plain callback) so the connection to `colorSchemeChanged` is dropped by
    Qt when either end is destroyed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.choice: ThemeChoice | None = None
        self.app: QApplication | None = None

    @Slot(Qt.ColorScheme)
    def on_scheme_changed(self, scheme: Qt.ColorScheme) -> None:
        if self.choice is ThemeChoice.SYSTEM and self.app is not None:
            log.info("system colour scheme changed to %s", scheme.name)
            _apply(self.app, ThemeChoice.SYSTEM)


_follower = _Follower()


def apply_theme(app: QApplication, choice: ThemeChoice) -> None:
    """Switch `app` to the Fusion style and the palette `choice` calls for.

    With SYSTEM, the palette follows the platform's colour scheme now and whenever it
    changes (an Unknown scheme counts as light). Emits `theme_events.changed` afterwards.
    """
    choice = ThemeChoice(choice)
    if _follower.app is not app:
        detach_theme()
        app.styleHints().colorSchemeChanged.connect(_follower.on_scheme_changed)
        _follower.app = app
    _follower.choice = choice
    _apply(app, choice)


def detach_theme() -> None:
    """Stop following the system colour scheme; the current palette and style stay.

    For shutdown and tests; a later `apply_theme` attaches again.
    """
    app = _follower.app
    if app is not None:
        app.styleHints().colorSchemeChanged.disconnect(_follower.on_scheme_changed)
    _follower.app = None
    _follower.choice = None


def current_choice() -> ThemeChoice | None:
    """The choice last passed to `apply_theme`, or None when no theme is applied."""
    return _follower.choice


def system_is_dark(app: QApplication) -> bool:
    """Whether the platform asks for a dark colour scheme (Unknown counts as light)."""
    return app.styleHints().colorScheme() == Qt.ColorScheme.Dark


def _apply(app: QApplication, choice: ThemeChoice) -> None:
    dark = system_is_dark(app) if choice is ThemeChoice.SYSTEM else choice is ThemeChoice.DARK
    if app.style().name().lower() != STYLE.lower() and QApplication.setStyle(STYLE) is None:
        raise RuntimeError(f"the {STYLE} style is not available in this Qt build")
    palette = dark_palette() if dark else light_palette(app)
    QApplication.setPalette(palette)
    # Qt posts the change to top-level widgets; deliver it now, so every widget has its new
    # palette (and has restyled itself) by the time `changed` fires.
    QCoreApplication.sendPostedEvents(None, QEvent.Type.ApplicationPaletteChange)
    clear_icon_cache()
    log.info("theme %s applied (%s palette)", choice.value, "dark" if dark else "light")
    theme_events.changed.emit(dark)


def light_palette(app: QApplication) -> QPalette:
    """Fusion's standard palette, or its light variant when the system is dark.

    Since Qt 6.5 Fusion's standard palette turns dark with the platform's colour scheme,
    which would make an explicit LIGHT choice dark on a dark desktop.
    """
    standard = app.style().standardPalette()
    return QPalette(standard) if not is_dark(standard) else fusion_light_palette()


def fusion_light_palette() -> QPalette:
    """Fusion's light standard palette, rebuilt with the same colours as Qt's.

    Used where Qt would hand out the dark variant; a test checks it against Qt's own.
    """
    black, white = QColor(Qt.GlobalColor.black), QColor(Qt.GlobalColor.white)
    window = QColor(239, 239, 239)
    dark = window.darker(150)
    mid = window.darker(130)
    shadow = dark.darker(135)
    palette = QPalette(black, window, window.lighter(150), dark, mid, black, white)
    palette.setColor(QPalette.ColorRole.Midlight, mid.lighter(110))
    palette.setColor(QPalette.ColorRole.Button, window)
    palette.setColor(QPalette.ColorRole.Shadow, shadow)
    palette.setColor(QPalette.ColorRole.Highlight, QColor(48, 140, 198))
    palette.setColor(QPalette.ColorRole.HighlightedText, white)
    palette.setColor(QPalette.ColorRole.PlaceholderText, QColor(0, 0, 0, 128))
    disabled = QPalette.ColorGroup.Disabled
    for role in (
        QPalette.ColorRole.Text,
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.ButtonText,
    ):
        palette.setColor(disabled, role, QColor(190, 190, 190))
    palette.setColor(disabled, QPalette.ColorRole.Base, window)
    palette.setColor(disabled, QPalette.ColorRole.Dark, QColor(209, 209, 209).darker(110))
    palette.setColor(disabled, QPalette.ColorRole.Shadow, shadow.lighter(150))
    palette.setColor(disabled, QPalette.ColorRole.Highlight, QColor(145, 145, 145))
    _set_accent(palette)
    return palette


# (role, active colour, disabled colour or None for the same) of the dark palette.
_DARK_COLOURS: tuple[tuple[QPalette.ColorRole, str, str | None], ...] = (
    (QPalette.ColorRole.Window, "#2d2d30", None),
    (QPalette.ColorRole.WindowText, "#e6e6e6", "#7c7c80"),
    (QPalette.ColorRole.Base, "#1e1e1f", "#262628"),
    (QPalette.ColorRole.AlternateBase, "#27272a", None),
    (QPalette.ColorRole.Text, "#e6e6e6", "#7c7c80"),
    (QPalette.ColorRole.Button, "#36363a", "#2f2f32"),
    (QPalette.ColorRole.ButtonText, "#e6e6e6", "#7c7c80"),
    (QPalette.ColorRole.BrightText, "#ff7b72", None),
    (QPalette.ColorRole.Highlight, "#2f6fca", "#45454a"),
    (QPalette.ColorRole.HighlightedText, "#ffffff", "#a0a0a4"),
    (QPalette.ColorRole.PlaceholderText, "#9a9aa0", "#6a6a6e"),
    (QPalette.ColorRole.ToolTipBase, "#3a3a3e", None),
    (QPalette.ColorRole.ToolTipText, "#f0f0f0", None),
    (QPalette.ColorRole.Link, "#6cb4ff", "#5c7a99"),
    (QPalette.ColorRole.LinkVisited, "#c29cff", "#7d6d99"),
    # Fusion's bevels and frames. Disabled Light is the window colour, so no etched ghost
    # appears under disabled text.
    (QPalette.ColorRole.Light, "#4b4b50", "#2d2d30"),
    (QPalette.ColorRole.Midlight, "#3d3d41", None),
    (QPalette.ColorRole.Mid, "#242427", None),
    (QPalette.ColorRole.Dark, "#1b1b1d", None),
    (QPalette.ColorRole.Shadow, "#0c0c0d", None),
)


def dark_palette() -> QPalette:
    """A complete dark palette: every role Fusion reads, for the Active, Inactive and
    Disabled groups, with text-on-background contrast of at least `MIN_TEXT_CONTRAST`."""
    palette = QPalette()
    for role, colour, disabled in _DARK_COLOURS:
        palette.setColor(role, QColor(colour))  # every group
        if disabled is not None:
            palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(disabled))
    _set_accent(palette)
    return palette


def _set_accent(palette: QPalette) -> None:
    """Accent (Qt 6.6+) follows Highlight in every group, as in Qt's own palettes."""
    accent = getattr(QPalette.ColorRole, "Accent", None)
    if accent is None:
        return
    for group in (
        QPalette.ColorGroup.Active,
        QPalette.ColorGroup.Inactive,
        QPalette.ColorGroup.Disabled,
    ):
        palette.setColor(group, accent, palette.color(group, QPalette.ColorRole.Highlight))


def is_dark(palette: QPalette) -> bool:
    """Whether `palette` is a dark one, judged by its Window colour's lightness."""
    return palette.color(QPalette.ColorRole.Window).lightnessF() < 0.5


def code_style(palette: QPalette) -> str:
    """The Pygments style for code blocks shown in `palette`."""
    return DARK_CODE_STYLE if is_dark(palette) else LIGHT_CODE_STYLE


def relative_luminance(colour: QColor) -> float:
    """WCAG 2 relative luminance of `colour` (0 black .. 1 white), alpha ignored."""

    def channel(value: float) -> float:
        return value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4

    return (
        0.2126 * channel(colour.redF())
        + 0.7152 * channel(colour.greenF())
        + 0.0722 * channel(colour.blueF())
    )


def contrast_ratio(a: QColor, b: QColor) -> float:
    """WCAG 2 contrast ratio of two colours (1 .. 21); 4.5 is the minimum for body text."""
    first, second = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (first + 0.05) / (second + 0.05)
