"""Arbor's icons: small stroke SVGs from `resources/icons/`, drawn in the palette's colours.

The SVG files use `currentColor` for every stroke, like web icon sets, so one file serves the
light and the dark theme: `icon()` substitutes the palette's text colour (and, for the
disabled state, its disabled text colour) before rendering. Icons are pre-rendered to pixmaps
at 1x and 2x of the menu and toolbar sizes rather than handed to Qt's SVG icon engine,
because that engine would draw `currentColor` as black whatever the theme.

Rendered icons are cached per (name, colours); a palette change makes different keys, and
`clear_icon_cache()` (called by `app.look.theme.apply_theme`) drops the stale ones. Use this
module from the GUI thread only, after the QApplication exists.
"""

from __future__ import annotations

import logging
import re
from functools import cache
from pathlib import Path

from PySide6.QtCore import QByteArray, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QImage, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer

log = logging.getLogger(__name__)

RESOURCES_DIR = Path(__file__).resolve().parents[2] / "resources"
ICONS_DIR = RESOURCES_DIR / "icons"

# Logical sizes the icons are pre-rendered at (menus, toolbars), each at these scales.
ICON_SIZES: tuple[int, ...] = (16, 24)
ICON_SCALES: tuple[int, ...] = (1, 2)

_CURRENT_COLOR = b"currentColor"
_NAME = re.compile(r"[a-z0-9_]+")

_CacheKey = tuple[str, int, int]
_icons: dict[_CacheKey, QIcon] = {}


class UnknownIconError(LookupError):
    """Raised for an icon name that has no SVG file in `resources/icons/`."""


def icon_names() -> tuple[str, ...]:
    """The names `icon()` accepts (the SVG files in `resources/icons/`), sorted."""
    return tuple(sorted(path.stem for path in ICONS_DIR.glob("*.svg")))


def icon_path(name: str) -> Path:
    """The SVG file of icon `name`; `UnknownIconError` when there is none."""
    path = ICONS_DIR / f"{name}.svg"
    if not _NAME.fullmatch(name) or not path.is_file():
        known = ", ".join(icon_names())
        raise UnknownIconError(f"no icon named {name!r} in {ICONS_DIR} (known: {known})")
    return path


@cache
def _svg_source(name: str) -> bytes:
    """The SVG text of `name`, read once: the files do not change while the app runs."""
    return icon_path(name).read_bytes()


def _rgba(colour: QColor) -> int:
    return int(colour.rgba())


def icon(name: str, palette: QPalette | None = None) -> QIcon:
    """Icon `name` in `palette`'s text colours (the application palette by default).

    Normal mode uses the Active Text colour, Disabled mode the Disabled Text colour. The
    result is cached; callers should ask again after a theme change (`theme_events.changed`)
    rather than keep the QIcon, since its colours are baked in.
    """
    if QGuiApplication.instance() is None:
        raise RuntimeError("icon() needs a QGuiApplication (pixmaps cannot exist without one)")
    palette = palette if palette is not None else QGuiApplication.palette()
    normal = palette.color(QPalette.ColorGroup.Active, QPalette.ColorRole.Text)
    disabled = palette.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text)
    key = (name, _rgba(normal), _rgba(disabled))
    found = _icons.get(key)
    if found is not None:
        return found
    source = _svg_source(name)
    result = QIcon()
    for mode, colour in ((QIcon.Mode.Normal, normal), (QIcon.Mode.Disabled, disabled)):
        renderer = _renderer(name, source, colour)
        for size in ICON_SIZES:
            for scale in ICON_SCALES:
                result.addPixmap(_render(renderer, size * scale, colour), mode, QIcon.State.Off)
    _icons[key] = result
    return result


def clear_icon_cache() -> None:
    """Forget every rendered icon (the palette changed, so their colours are stale)."""
    _icons.clear()


def icon_cache_size() -> int:
    """How many rendered icons are cached (for tests and debugging)."""
    return len(_icons)


def _renderer(name: str, source: bytes, colour: QColor) -> QSvgRenderer:
    """A renderer for `source` with `currentColor` replaced by `colour`'s opaque RGB.

    Translucency is applied when painting (SVG Tiny colours carry no alpha).
    """
    rgb = colour.name(QColor.NameFormat.HexRgb).encode("ascii")
    renderer = QSvgRenderer(QByteArray(source.replace(_CURRENT_COLOR, rgb)))
    if not renderer.isValid():
        raise ValueError(f"icon {name!r}: {icon_path(name)} is not a valid SVG file")
    return renderer


def _render(renderer: QSvgRenderer, pixels: int, colour: QColor) -> QPixmap:
    """`renderer`'s drawing on a transparent square `pixels` wide, at `colour`'s opacity."""
    image = QImage(QSize(pixels, pixels), QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
    painter.setOpacity(colour.alphaF())
    renderer.render(painter, QRectF(0, 0, pixels, pixels))
    painter.end()
    return QPixmap.fromImage(image)
