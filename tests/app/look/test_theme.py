"""Themes and icons: the dark and light palettes, following the system scheme, icons recoloured
to the palette, and the painted widgets staying readable after a switch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from PySide6.QtCore import QByteArray, QCoreApplication, QEvent, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QIcon, QImage, QPainter, QPalette, QTextDocument
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication, QStyle, QStyleOptionViewItem, QWidget
from pytestqt.qtbot import QtBot

from app.chat.chat_model import ChatModel, MessageRow
from app.chat.chat_view import ChatView
from app.chat.message_delegate import MessageDelegate
from app.look import theme
from app.look.icons import (
    ICON_SCALES,
    ICON_SIZES,
    ICONS_DIR,
    UnknownIconError,
    clear_icon_cache,
    icon,
    icon_cache_size,
    icon_names,
    icon_path,
)
from app.look.theme import (
    MIN_TEXT_CONTRAST,
    ThemeChoice,
    apply_theme,
    contrast_ratio,
    current_choice,
    detach_theme,
    is_dark,
    theme_events,
)
from app.tree.tree_panel import PanelNode, TreePanel

# The icons the main window and the chat view use (see the lead's action mapping).
EXPECTED_ICONS = (
    "new_conversation",
    "send",
    "stop",
    "tree_panel",
    "settings",
    "model",
    "import",
    "export",
    "edit",
    "regenerate",
    "rewind",
    "fork",
    "copy",
    "delete",
    "undo",
    "search",
    "previous",
    "next",
    "continue",
)

Role = QPalette.ColorRole
Group = QPalette.ColorGroup


@pytest.fixture(autouse=True)
def _restore_theme(qapp: QApplication) -> Iterator[None]:
    """Put the application's style and palette back, so other test files see the defaults."""
    style = qapp.style().name()
    palette = QPalette(qapp.palette())  # keeps the resolve mask: "not set" stays "not set"
    palette_set = qapp.testAttribute(Qt.ApplicationAttribute.AA_SetPalette)
    clear_icon_cache()
    yield
    detach_theme()
    if qapp.style().name() != style:
        QApplication.setStyle(style)
    QApplication.setPalette(palette)
    QApplication.setAttribute(Qt.ApplicationAttribute.AA_SetPalette, palette_set)
    QCoreApplication.sendPostedEvents(None, QEvent.Type.ApplicationPaletteChange)
    clear_icon_cache()


def opaque_pixels(image: QImage) -> list[QColor]:
    """The fully opaque pixels of `image` (anti-aliased edges are blends, so left out)."""
    image = image.convertToFormat(QImage.Format.Format_ARGB32)
    out: list[QColor] = []
    for y in range(image.height()):
        for x in range(image.width()):
            colour = image.pixelColor(x, y)
            if colour.alpha() == 255:
                out.append(colour)
    return out


def rgb(colour: QColor) -> tuple[int, int, int]:
    return colour.red(), colour.green(), colour.blue()


# --- icons -------------------------------------------------------------------------------


def test_every_expected_icon_has_a_file() -> None:
    assert set(EXPECTED_ICONS) <= set(icon_names())
    assert icon_path("send") == ICONS_DIR / "send.svg"


@pytest.mark.parametrize("name", icon_names())
def test_icon_files_are_valid_24px_stroke_svgs(name: str) -> None:
    source = icon_path(name).read_bytes()
    renderer = QSvgRenderer(QByteArray(source))
    assert renderer.isValid()
    assert renderer.viewBoxF() == QRectF(0, 0, 24, 24)
    assert b'stroke="currentColor"' in source
    assert b"#" not in source  # every colour comes from the palette


@pytest.mark.parametrize("choice", [ThemeChoice.LIGHT, ThemeChoice.DARK])
def test_icons_are_drawn_in_the_palette_text_colour(
    qapp: QApplication, choice: ThemeChoice
) -> None:
    apply_theme(qapp, choice)
    palette = qapp.palette()
    text = palette.color(Group.Active, Role.Text)
    disabled = palette.color(Group.Disabled, Role.Text)
    for name in icon_names():
        result = icon(name)
        assert not result.isNull()
        sizes = {(size.width(), size.height()) for size in result.availableSizes()}
        assert sizes == {(s * k, s * k) for s in ICON_SIZES for k in ICON_SCALES}, name
        for pixels_wide in (24, 48):  # a toolbar icon at 1x and at 2x
            pixmap = result.pixmap(QSize(pixels_wide, pixels_wide))
            assert not pixmap.isNull()
            pixels = opaque_pixels(pixmap.toImage())
            assert len(pixels) >= pixels_wide // 2, f"{name}: almost nothing drawn"
            assert {rgb(c) for c in pixels} == {rgb(text)}, name
            # Light theme: dark strokes; dark theme: light strokes.
            assert all((c.lightnessF() > 0.5) == is_dark(palette) for c in pixels), name
        grey = opaque_pixels(result.pixmap(QSize(48, 48), QIcon.Mode.Disabled).toImage())
        assert grey, name
        assert {rgb(c) for c in grey} == {rgb(disabled)}, name


def test_unknown_icon_names_raise_a_clear_error() -> None:
    with pytest.raises(UnknownIconError, match=r"no icon named 'no_such_icon'.*known: "):
        icon("no_such_icon")
    with pytest.raises(UnknownIconError):
        icon("../icons/send")  # names are names, not paths
    assert isinstance(UnknownIconError("x"), LookupError)


def test_icons_are_cached_per_colour(qapp: QApplication) -> None:
    apply_theme(qapp, ThemeChoice.LIGHT)
    first = icon("send")
    assert icon("send") is first
    assert icon_cache_size() == 1
    dark = theme.dark_palette()
    in_dark = icon("send", dark)
    assert in_dark is not first
    assert icon_cache_size() == 2
    clear_icon_cache()
    assert icon_cache_size() == 0
    assert icon("send") is not first


# --- palettes ----------------------------------------------------------------------------

TEXT_PAIRS = (
    (Role.Text, Role.Base),
    (Role.WindowText, Role.Window),
    (Role.ButtonText, Role.Button),
    (Role.HighlightedText, Role.Highlight),
    (Role.ToolTipText, Role.ToolTipBase),
    (Role.PlaceholderText, Role.Base),
    (Role.Link, Role.Base),
)


def test_dark_theme_is_dark_and_readable(qapp: QApplication) -> None:
    apply_theme(qapp, ThemeChoice.DARK)
    palette = qapp.palette()
    assert qapp.style().name().lower() == "fusion"
    assert is_dark(palette)
    assert current_choice() is ThemeChoice.DARK
    for fg, bg in TEXT_PAIRS:
        ratio = contrast_ratio(palette.color(fg), palette.color(bg))
        assert ratio >= MIN_TEXT_CONTRAST, f"{fg.name} on {bg.name}: {ratio:.2f}"
    # Disabled text is dimmer than enabled text but still visible.
    enabled = contrast_ratio(palette.color(Role.Text), palette.color(Role.Base))
    base = palette.color(Group.Disabled, Role.Base)
    dimmed = contrast_ratio(palette.color(Group.Disabled, Role.Text), base)
    assert 2.0 <= dimmed < enabled


def test_light_theme_is_light_and_readable(qapp: QApplication) -> None:
    apply_theme(qapp, ThemeChoice.DARK)
    apply_theme(qapp, ThemeChoice.LIGHT)
    palette = qapp.palette()
    assert not is_dark(palette)
    text, base = palette.color(Role.Text), palette.color(Role.Base)
    assert text.lightnessF() < base.lightnessF()
    assert contrast_ratio(text, base) >= MIN_TEXT_CONTRAST
    assert rgb(palette.color(Role.Window)) == rgb(qapp.style().standardPalette().color(Role.Window))


def test_the_light_fallback_is_fusions_own_light_palette(
    qapp: QApplication, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a dark desktop Fusion's standard palette is dark; LIGHT then uses this copy."""
    apply_theme(qapp, ThemeChoice.LIGHT)
    standard = qapp.style().standardPalette()
    assert not is_dark(standard)  # the offscreen platform has no dark scheme
    ours = theme.fusion_light_palette()
    roles = [r for r in Role if r not in (Role.NColorRoles, Role.NoRole)]
    for group in (Group.Active, Group.Inactive, Group.Disabled):
        for role in roles:
            assert ours.color(group, role) == standard.color(group, role), (group, role)
    assert theme.light_palette(qapp) == standard
    # A dark desktop: Fusion hands out a dark standard palette, LIGHT stays light.
    monkeypatch.setattr(type(qapp.style()), "standardPalette", lambda _self: theme.dark_palette())
    assert is_dark(qapp.style().standardPalette())
    apply_theme(qapp, ThemeChoice.LIGHT)
    assert qapp.palette() == ours


def test_is_dark_and_contrast_helpers() -> None:
    light, dark = QPalette(), QPalette()
    light.setColor(Role.Window, QColor("#f0f0f0"))
    dark.setColor(Role.Window, QColor("#202020"))
    assert not is_dark(light)
    assert is_dark(dark)
    assert contrast_ratio(QColor("black"), QColor("white")) == pytest.approx(21.0)
    assert contrast_ratio(QColor("#777777"), QColor("#777777")) == pytest.approx(1.0)


def test_system_choice_follows_the_colour_scheme(
    qapp: QApplication, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheme = {"dark": True}
    monkeypatch.setattr(theme, "system_is_dark", lambda _app: scheme["dark"])
    apply_theme(qapp, ThemeChoice.SYSTEM)
    assert is_dark(qapp.palette())

    scheme["dark"] = False
    qapp.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert not is_dark(qapp.palette())

    # A pinned choice ignores the system.
    apply_theme(qapp, ThemeChoice.LIGHT)
    scheme["dark"] = True
    qapp.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Dark)
    assert not is_dark(qapp.palette())

    # So does a detached one.
    apply_theme(qapp, ThemeChoice.SYSTEM)
    assert is_dark(qapp.palette())
    detach_theme()
    scheme["dark"] = False
    qapp.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert is_dark(qapp.palette())
    assert current_choice() is None


def test_system_choice_uses_the_reported_scheme(qapp: QApplication) -> None:
    apply_theme(qapp, ThemeChoice.SYSTEM)
    assert is_dark(qapp.palette()) == (qapp.styleHints().colorScheme() == Qt.ColorScheme.Dark)


def test_theme_change_hook_fires_after_the_palette_and_clears_the_icons(
    qapp: QApplication, qtbot: QtBot
) -> None:
    apply_theme(qapp, ThemeChoice.LIGHT)
    window = QWidget()
    qtbot.addWidget(window)
    child = QWidget(window)
    icon("send")
    icon("stop")
    assert icon_cache_size() == 2
    seen: list[tuple[bool, bool, bool, bool, int]] = []

    def record(dark: bool) -> None:
        seen.append(
            (
                dark,
                is_dark(QApplication.palette()),
                is_dark(window.palette()),  # widgets have their new palette already
                is_dark(child.palette()),
                icon_cache_size(),
            )
        )

    theme_events.changed.connect(record)
    try:
        with qtbot.waitSignal(theme_events.changed, timeout=1000) as blocker:
            apply_theme(qapp, ThemeChoice.DARK)
        assert blocker.args == [True]
        apply_theme(qapp, ThemeChoice.LIGHT)
    finally:
        theme_events.changed.disconnect(record)
    assert seen == [(True, True, True, True, 0), (False, False, False, False, 0)]
    # Icons fetched again in the hook come out in the new colours.
    pixels = opaque_pixels(icon("send").pixmap(QSize(24, 24)).toImage())
    assert {rgb(c) for c in pixels} == {rgb(qapp.palette().color(Role.Text))}


# --- the painted widgets -----------------------------------------------------------------


def paint_message(delegate: MessageDelegate, row: MessageRow, palette: QPalette) -> QImage:
    """`row` painted by `delegate` on the view's Base colour, as the view would."""
    model = ChatModel()
    model.set_rows([row])
    index = model.index(0, 0)
    option = QStyleOptionViewItem()
    option.palette = palette
    option.font = QApplication.font()
    option.state = QStyle.StateFlag.State_Enabled
    option.rect = QRect(0, 0, 420, 100)
    height = delegate.sizeHint(option, index).height()
    option.rect = QRect(0, 0, 420, height)
    image = QImage(420, height, QImage.Format.Format_ARGB32)
    image.fill(palette.color(Role.Base))
    painter = QPainter(image)
    delegate.paint(painter, option, index)
    painter.end()
    return image


@pytest.mark.parametrize("choice", [ThemeChoice.DARK, ThemeChoice.LIGHT])
@pytest.mark.parametrize("role", ["assistant", "user"])
def test_message_text_is_readable_in_both_themes(
    qapp: QApplication, choice: ThemeChoice, role: str
) -> None:
    apply_theme(qapp, choice)
    palette = qapp.palette()
    delegate = MessageDelegate()
    row = MessageRow(1, role, "Readable **text** with `code` in it", "complete", 0, 1)
    image = paint_message(delegate, row, palette)
    counts = Counter(
        rgb(image.pixelColor(x, y)) for y in range(image.height()) for x in range(image.width())
    )
    base = rgb(palette.color(Role.Base))
    # The bubble is the commonest colour that is not the view's background.
    bubble = QColor(*next(c for c, _ in counts.most_common() if c != base))
    colours = [QColor(*c) for c in counts]
    brightest = max(colours, key=theme.relative_luminance)
    darkest = min(colours, key=theme.relative_luminance)
    text = brightest if is_dark(palette) else darkest
    assert contrast_ratio(text, bubble) >= MIN_TEXT_CONTRAST
    assert rgb(text) == rgb(palette.color(Role.Text))
    # Text is a small part of the message; the rest is bubble and background.
    assert counts[rgb(text)] < counts[rgb(bubble)]
    assert (theme.relative_luminance(bubble) < 0.2) == is_dark(palette)


def _link_colour(doc: QTextDocument) -> QColor:
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            if fmt.isAnchor():
                return fmt.foreground().color()
            it += 1
        block = block.next()
    raise AssertionError("no link in the document")


def test_chat_view_drops_coloured_documents_on_a_palette_change(
    qapp: QApplication, qtbot: QtBot
) -> None:
    apply_theme(qapp, ThemeChoice.LIGHT)
    window = QWidget()  # as in the main window: a child widget, which Qt tells at once
    qtbot.addWidget(window)
    view = ChatView(window)
    row = MessageRow(7, "assistant", "See [the docs](https://example.org).", "complete", 0, 1)
    view.set_rows([row])
    doc = view.delegate.document(row, 300)
    assert rgb(_link_colour(doc)) == rgb(qapp.palette().color(Role.Link))
    assert view.delegate.cache_size() == 1

    apply_theme(qapp, ThemeChoice.DARK)
    assert view.delegate.cache_size() == 0
    dark_link = _link_colour(view.delegate.document(row, 300))
    assert rgb(dark_link) == rgb(qapp.palette().color(Role.Link))
    assert contrast_ratio(dark_link, qapp.palette().color(Role.Base)) >= MIN_TEXT_CONTRAST

    # A palette set on the view alone also reaches the links.
    own = QPalette(view.palette())
    own.setColor(Role.Link, QColor("#ff8800"))
    view.setPalette(own)
    assert rgb(_link_colour(view.delegate.document(row, 300))) == (255, 136, 0)


def test_tree_panel_restyles_when_the_theme_changes(qapp: QApplication, qtbot: QtBot) -> None:
    apply_theme(qapp, ThemeChoice.LIGHT)
    window = QWidget()
    qtbot.addWidget(window)
    panel = TreePanel(window)
    nodes = [
        PanelNode(1, None, "system", "System prompt"),
        PanelNode(2, 1, "user", "Hello"),
        PanelNode(3, 2, "assistant", "Hi"),
    ]
    panel.set_tree(nodes, [1, 2, 3])
    light_user = panel.node_item(2).brush().color()
    apply_theme(qapp, ThemeChoice.DARK)
    palette = qapp.palette()
    assert rgb(panel.node_item(2).brush().color()) == rgb(palette.color(Role.Link))
    assert rgb(panel.node_item(2).brush().color()) != rgb(light_user)
    assert rgb(panel.node_item(1).brush().color()) == rgb(palette.color(Role.Base))
    assert rgb(panel.edge_items()[3].pen().color()) == rgb(palette.color(Role.Highlight))
