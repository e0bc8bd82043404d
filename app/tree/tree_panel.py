"""The tree panel: the whole conversation drawn as a graph, root at the top.

Each message is a small circle (user and assistant in distinct palette colours, the system root
as a ring), each parent-child link a straight line. The active path is drawn in the palette's
Highlight colour, and nodes that hold a KV-cache checkpoint carry a small square badge (filled:
in RAM, outlined: on disk). Clicking a node emits `node_clicked`; a left-drag on empty space
pans, Ctrl+wheel zooms.

The keyboard reaches every node (app.tree.tree_navigation): the arrows move a focus ring (Up: the
parent, Down: a child, Left/Right: the other versions), Home and End go to the root and the
active branch's end, and Enter or Space activates the node as a click does. A screen reader
hears each node it lands on (the panel's accessible description, and an announcement).

The panel only draws what it is given (`PanelNode` values); `panel_nodes_from_tree` builds
those from an `engine.core.tree.Tree` and `layout_tree` places them (both Qt-free, in
app.tree.tree_layout; the first two are re-exported here). Every `set_tree` call replaces the
drawing. The layout is O(n); the items are built-in ellipse, line and rect items (painted in
C++, nothing overridden) in a BSP-indexed scene; and items of node ids that are drawn already
are reused and only updated where something changed, so redrawing a 1,000-node tree after
each change stays cheap.
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QPoint, QRect, QRectF, Qt, Signal
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFocusEvent,
    QKeyEvent,
    QMouseEvent,
    QPainter,
    QPalette,
    QPen,
    QWheelEvent,
)
from PySide6.QtWidgets import (
    QGraphicsEllipseItem,
    QGraphicsItem,
    QGraphicsLineItem,
    QGraphicsRectItem,
    QGraphicsScene,
    QGraphicsView,
    QWidget,
)

from app.look.accessibility import announce
from app.tree.tree_layout import (
    NODE_RADIUS,
    PanelNode,
    layout_tree,
    panel_nodes_from_tree,
    preview,
    validate_nodes,
)
from app.tree.tree_navigation import Step, TreeNavigation
from engine.core.tree import Role

log = logging.getLogger(__name__)

__all__ = [
    "MAX_ZOOM",
    "MIN_ZOOM",
    "NODE_RADIUS",
    "EdgeItem",
    "NodeItem",
    "PanelNode",
    "PanelUpdate",
    "TreePanel",
    "panel_nodes_from_tree",
    "preview",
]

BADGE_SIZE = 6.0

MIN_ZOOM = 0.1
MAX_ZOOM = 4.0
ZOOM_STEP = 1.25
WHEEL_ZOOM_PER_NOTCH = 1.15

# Looked up once: attribute access on PySide enums is slow enough to show at 1,000 items.
_SYSTEM = Role.SYSTEM.value
_POINTING_HAND = Qt.CursorShape.PointingHandCursor

# Stacking order: plain edges under active edges under nodes. Plain edges keep the default z,
# so only the few active ones cost a setZValue call.
Z_EDGE = 0.0
Z_ACTIVE_EDGE = 1.0
Z_NODE = 2.0
Z_ACTIVE_NODE = 3.0

FOCUS_RING_GAP = 4.0  # between a node's circle and the keyboard's focus ring

ACCESSIBLE_NAME = "Conversation tree"
KEYS_HINT = ("Arrow keys move between messages (left and right: other versions), "
             "Enter shows that branch")

_STEPS = {
    Qt.Key.Key_Up: Step.PARENT,
    Qt.Key.Key_Down: Step.CHILD,
    Qt.Key.Key_Left: Step.PREVIOUS_SIBLING,
    Qt.Key.Key_Right: Step.NEXT_SIBLING,
    Qt.Key.Key_Home: Step.ROOT,
    Qt.Key.Key_End: Step.ACTIVE_LEAF,
}
_ACTIVATE = (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Space)


class NodeItem(QGraphicsEllipseItem):
    """One message's circle. Plain attributes describe what is drawn (handy for tests)."""

    def __init__(self, node_id: int) -> None:
        super().__init__(-NODE_RADIUS, -NODE_RADIUS, 2 * NODE_RADIUS, 2 * NODE_RADIUS)
        self.node_id = node_id
        self.parent_id: int | None = None
        self.role = ""
        self.label = ""
        self.highlighted = False
        self.checkpoint: str | None = None
        self.badge: QGraphicsRectItem | None = None
        self.setZValue(Z_NODE)
        self.setCursor(_POINTING_HAND)

    def sync(
        self, node: PanelNode, centre: tuple[float, float], highlighted: bool, style: _Style
    ) -> None:
        """Make the item show `node` at `centre`, touching only what changed."""
        if (self.x(), self.y()) != centre:
            self.setPos(centre[0], centre[1])
        self.parent_id = node.parent
        looks_changed = (
            node.role != self.role
            or highlighted != self.highlighted
            or node.checkpoint != self.checkpoint
        )
        if looks_changed or node.label != self.label:
            self.setToolTip(_tooltip(node))
        self.label = node.label
        if not looks_changed:
            return
        if highlighted != self.highlighted:
            self.setZValue(Z_ACTIVE_NODE if highlighted else Z_NODE)
        self.role = node.role
        self.highlighted = highlighted
        if node.checkpoint != self.checkpoint:
            self._set_badge(node.checkpoint is not None)
            self.checkpoint = node.checkpoint
        style.apply_node(self)

    def _set_badge(self, wanted: bool) -> None:
        if wanted and self.badge is None:
            # Top right of the circle, inside half a column so it never touches a neighbour.
            self.badge = QGraphicsRectItem(
                NODE_RADIUS - BADGE_SIZE / 2,
                -NODE_RADIUS - BADGE_SIZE / 2 + 1,
                BADGE_SIZE,
                BADGE_SIZE,
                self,
            )
        elif not wanted and self.badge is not None:
            badge, self.badge = self.badge, None
            scene = badge.scene()
            badge.setParentItem(None)  # type: ignore[arg-type]  # Qt takes None; the stubs do not
            if scene is not None:
                scene.removeItem(badge)  # Python owns it now; dropping it deletes it


class EdgeItem(QGraphicsLineItem):
    """The line from a parent's centre to its child's centre."""

    def __init__(self, child_id: int) -> None:
        super().__init__()
        self.child_id = child_id
        self.parent_id: int | None = None
        self.highlighted: bool | None = None  # None: not styled yet

    def sync(
        self, parent_id: int, start: tuple[float, float], end: tuple[float, float],
        highlighted: bool, style: _Style,
    ) -> None:
        """Make the line join `start` and `end`, touching only what changed."""
        self.parent_id = parent_id
        line = self.line()
        if (line.x1(), line.y1(), line.x2(), line.y2()) != (*start, *end):
            self.setLine(start[0], start[1], end[0], end[1])
        if highlighted != self.highlighted:
            if highlighted or self.zValue() != Z_EDGE:
                self.setZValue(Z_ACTIVE_EDGE if highlighted else Z_EDGE)
            self.highlighted = highlighted
            style.apply_edge(self)


def _tooltip(node: PanelNode) -> str:
    where = {"ram": " · checkpoint in RAM", "disk": " · checkpoint on disk"}
    title = node.role.capitalize() + where.get(node.checkpoint or "", "")
    # "<qt>" forces rich text, so a label that looks like markup is shown as typed.
    return f"<qt><b>{html.escape(title)}</b><br>{html.escape(node.label)}</qt>"


def _mix(a: QColor, b: QColor, t: float) -> QColor:
    """`a` moved a fraction `t` towards `b`."""
    return QColor.fromRgbF(
        a.redF() + (b.redF() - a.redF()) * t,
        a.greenF() + (b.greenF() - a.greenF()) * t,
        a.blueF() + (b.blueF() - a.blueF()) * t,
    )


@dataclass(frozen=True)
class _Style:
    """Pens and brushes derived from the palette, shared by all items."""

    fills: dict[str, QBrush]
    outline: QPen
    system_outline: QPen
    active_outline: QPen
    edge: QPen
    active_edge: QPen
    badge_pen: QPen
    badge_fill: dict[str, QBrush]
    focus_ring: QPen

    @classmethod
    def from_palette(cls, palette: QPalette) -> _Style:
        text = palette.color(QPalette.ColorRole.Text)
        base = palette.color(QPalette.ColorRole.Base)
        accent = palette.color(QPalette.ColorRole.Highlight)
        user = palette.color(QPalette.ColorRole.Link)
        assistant = _mix(text, base, 0.45)
        return cls(
            fills={
                Role.SYSTEM.value: QBrush(base),
                Role.USER.value: QBrush(user),
                Role.ASSISTANT.value: QBrush(assistant),
                Role.TOOL.value: QBrush(_mix(assistant, base, 0.5)),
            },
            outline=QPen(_mix(text, base, 0.25), 1.0),
            system_outline=QPen(text, 2.0),
            active_outline=QPen(accent, 3.0),
            edge=QPen(_mix(text, base, 0.6), 1.2),
            active_edge=QPen(accent, 3.0),
            badge_pen=QPen(text, 1.2),
            badge_fill={"ram": QBrush(text), "disk": QBrush(base)},
            focus_ring=QPen(text, 1.5, Qt.PenStyle.DashLine),
        )

    def apply_node(self, item: NodeItem) -> None:
        item.setBrush(self.fills[item.role])
        if item.highlighted:
            item.setPen(self.active_outline)
        elif item.role == _SYSTEM:
            item.setPen(self.system_outline)
        else:
            item.setPen(self.outline)
        if item.badge is not None and item.checkpoint is not None:
            item.badge.setPen(self.badge_pen)
            item.badge.setBrush(self.badge_fill[item.checkpoint])

    def apply_edge(self, item: EdgeItem) -> None:
        item.setPen(self.active_edge if item.highlighted else self.edge)


@dataclass(frozen=True)
class PanelUpdate:
    """What the last `set_tree` did: the work a change cost, for tests and logs."""

    drawn: int
    reused: int
    removed: int


class TreePanel(QGraphicsView):
    """The conversation as a graph. Feed it with `set_tree`; listen to `node_clicked` (a
    click, or Enter on the keyboard's current node)."""

    node_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        scene = QGraphicsScene(self)
        # The drawing is static between two set_tree calls: a BSP index makes hit tests and
        # exposed-area queries logarithmic for thousands of items.
        scene.setItemIndexMethod(QGraphicsScene.ItemIndexMethod.BspTreeIndex)
        self.setScene(scene)
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setResizeAnchor(QGraphicsView.ViewportAnchor.AnchorViewCenter)
        self.setViewportUpdateMode(QGraphicsView.ViewportUpdateMode.SmartViewportUpdate)
        self.setCacheMode(QGraphicsView.CacheModeFlag.CacheBackground)
        # Built-in items set their own pen and brush on every paint.
        self.setOptimizationFlag(QGraphicsView.OptimizationFlag.DontSavePainterState, True)
        self.setAlignment(Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop)
        self._style = _Style.from_palette(self.palette())
        self._nodes: dict[int, NodeItem] = {}
        self.last_update = PanelUpdate(0, 0, 0)
        self._edges: dict[int, EdgeItem] = {}
        # The keyboard's place: the drawn nodes and active path (indexed on first use).
        self._drawn: tuple[Sequence[PanelNode], Sequence[int]] = ((), ())
        self._navigation: TreeNavigation | None = None
        self._current: int | None = None
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setAccessibleName(ACCESSIBLE_NAME)
        self.setToolTip(KEYS_HINT)

    # --- content -----------------------------------------------------------------------

    def set_tree(self, nodes: Sequence[PanelNode], active_path: Sequence[int]) -> None:
        """Replace the drawing with `nodes`, highlighting the ids in `active_path`.

        `nodes` lists each node once; siblings are drawn left to right in the order they
        appear. Ids in `active_path` that are not in `nodes` are ignored. The result is the
        same as drawing from scratch, but items of ids that were already drawn are reused
        and only what changed is touched, so a call after a small change is cheap.
        """
        started = time.perf_counter()
        validate_nodes(nodes)
        layout = layout_tree(nodes)
        centres = layout.centres
        active = set(active_path)
        scene = self.scene()
        style = self._style
        old_nodes, old_edges = self._nodes, self._edges
        nodes_out: dict[int, NodeItem] = {}
        edges_out: dict[int, EdgeItem] = {}
        reused = 0
        for node in nodes:
            centre = centres.get(node.id)
            if centre is None:
                continue  # unreachable (logged by the layout)
            on_path = node.id in active
            item = old_nodes.pop(node.id, None)
            if item is None:
                item = NodeItem(node.id)
                item.sync(node, centre, on_path, style)
                scene.addItem(item)
            else:
                item.sync(node, centre, on_path, style)
                reused += 1
            nodes_out[node.id] = item
            parent_centre = centres.get(node.parent) if node.parent is not None else None
            if node.parent is None or parent_centre is None:
                continue
            edge = old_edges.pop(node.id, None)
            highlighted = on_path and node.parent in active
            if edge is None:
                edge = EdgeItem(node.id)
                edge.sync(node.parent, parent_centre, centre, highlighted, style)
                scene.addItem(edge)
            else:
                edge.sync(node.parent, parent_centre, centre, highlighted, style)
            edges_out[node.id] = edge
        self._drawn = (list(nodes), list(active_path))
        self._navigation = None
        if self._current is not None and self._current not in nodes_out:
            self._current = None  # gone: the keyboard starts again at the branch's end
        if self._current is None and nodes_out and self.hasFocus():
            self._current = self.navigation().start()
            self.viewport().update()
        self.setAccessibleDescription(
            "" if self._current is None else self.navigation().describe(self._current))
        stale: list[QGraphicsItem] = [*old_nodes.values(), *old_edges.values()]
        if stale and not nodes_out:
            scene.clear()
        else:
            for gone in stale:
                scene.removeItem(gone)  # Python owns it now; dropping it deletes it
        self._nodes, self._edges = nodes_out, edges_out
        self.last_update = PanelUpdate(len(nodes_out), reused, len(stale))
        # The scene rect never shrinks on its own: set it, so a smaller tree scrolls right.
        scene.setSceneRect(QRectF(0, 0, layout.width, layout.height))
        log.debug(
            "tree panel: %d nodes drawn in %.1f ms (%d items reused, %d removed)",
            len(nodes_out), (time.perf_counter() - started) * 1000, reused, len(stale),
        )

    def center_on_node(self, node_id: int) -> None:
        """Scroll so that the node is in the middle of the view (unknown ids are ignored)."""
        item = self._nodes.get(node_id)
        if item is None:
            log.debug("tree panel: no node %d to centre on", node_id)
            return
        self.centerOn(item)

    # --- queries (tests, and callers that want to know what is drawn) ------------------

    def node_item(self, node_id: int) -> NodeItem:
        """The item drawn for a node; KeyError if it is not drawn."""
        return self._nodes[node_id]

    def node_items(self) -> Mapping[int, NodeItem]:
        """All node items by node id."""
        return dict(self._nodes)

    def edge_items(self) -> Mapping[int, EdgeItem]:
        """All edge items, keyed by the id of the child end."""
        return dict(self._edges)

    def node_at(self, pos: QPoint) -> int | None:
        """The id of the node under a viewport position, or None."""
        for item in self.items(pos):
            owner: QGraphicsItem | None = item
            while owner is not None and not isinstance(owner, NodeItem):
                owner = owner.parentItem()
            if isinstance(owner, NodeItem):
                return owner.node_id
        return None

    # --- the keyboard ------------------------------------------------------------------

    def navigation(self) -> TreeNavigation:
        """The drawn nodes indexed for stepping (built on first use after a `set_tree`)."""
        if self._navigation is None:
            self._navigation = TreeNavigation(*self._drawn)
        return self._navigation

    @property
    def current_node(self) -> int | None:
        """The node the keyboard is on (Enter activates it), or None."""
        return self._current

    def set_current_node(self, node_id: int | None, *, keyboard: bool = False) -> None:
        """Put the keyboard's focus ring on `node_id` (None: nowhere); `keyboard`: the user
        moved there with a key, so scroll to it and announce it to a screen reader."""
        if node_id is not None and node_id not in self._nodes:
            log.debug("tree panel: no node %d to make current", node_id)
            return
        self._current = node_id
        self.viewport().update()
        if node_id is None:
            self.setAccessibleDescription("")
            return
        spoken = self.navigation().describe(node_id)
        self.setAccessibleDescription(spoken)
        if keyboard:
            self.ensureVisible(self._nodes[node_id], 24, 24)
            announce(self, spoken)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Arrows, Home and End move between nodes; Enter or Space activates the node."""
        key = event.key()
        modifiers = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
        if (key in _STEPS or key in _ACTIVATE) and modifiers == Qt.KeyboardModifier.NoModifier:
            if not self._nodes:
                event.ignore()
                return
            current = self._current
            if current is None:
                current = self.navigation().start()
            if current is None:
                return
            if key in _ACTIVATE:
                self.set_current_node(current)
                log.debug("tree panel: node %d activated from the keyboard", current)
                self.node_clicked.emit(current)
            else:
                self.set_current_node(self.navigation().step(current, _STEPS[Qt.Key(key)]),
                                      keyboard=True)
            event.accept()
            return
        super().keyPressEvent(event)

    def focusInEvent(self, event: QFocusEvent) -> None:
        """The keyboard lands on the active branch's end (or where it was)."""
        super().focusInEvent(event)
        if self._current is None and self._nodes:
            self.set_current_node(self.navigation().start(), keyboard=True)
        else:
            self.viewport().update()

    def focusOutEvent(self, event: QFocusEvent) -> None:
        """The focus ring shows only while the panel has the keyboard."""
        super().focusOutEvent(event)
        self.viewport().update()

    def drawForeground(self, painter: QPainter, rect: QRectF | QRect) -> None:
        """The focus ring around the keyboard's node, while the panel has the focus."""
        super().drawForeground(painter, rect)
        item = self._nodes.get(self._current) if self._current is not None else None
        if item is None or not self.hasFocus():
            return
        radius = NODE_RADIUS + FOCUS_RING_GAP
        painter.save()
        painter.setPen(self._style.focus_ring)
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawEllipse(item.pos(), radius, radius)
        painter.restore()

    # --- zoom --------------------------------------------------------------------------

    def zoom(self) -> float:
        """The current scale factor (1.0 = actual size)."""
        return self.transform().m11()

    def set_zoom(self, factor: float) -> None:
        """Scale to `factor`, clamped to [MIN_ZOOM, MAX_ZOOM]."""
        target = min(max(factor, MIN_ZOOM), MAX_ZOOM)
        current = self.zoom()
        if current > 0 and abs(target - current) > 1e-9:
            ratio = target / current
            self.scale(ratio, ratio)

    def zoom_in(self) -> None:
        self.set_zoom(self.zoom() * ZOOM_STEP)

    def zoom_out(self) -> None:
        self.set_zoom(self.zoom() / ZOOM_STEP)

    def reset_zoom(self) -> None:
        self.set_zoom(1.0)

    # --- events ------------------------------------------------------------------------

    def mousePressEvent(self, event: QMouseEvent) -> None:
        """A left press on a node selects it; anywhere else, the hand drag pans."""
        if event.button() == Qt.MouseButton.LeftButton:
            node_id = self.node_at(event.position().toPoint())
            if node_id is not None:
                event.accept()
                self.set_current_node(node_id)
                self.node_clicked.emit(node_id)
                return
        super().mousePressEvent(event)

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        """Ends a hand drag; the release is ours even when no item wanted it."""
        super().mouseReleaseEvent(event)
        event.accept()

    def wheelEvent(self, event: QWheelEvent) -> None:
        """Ctrl+wheel zooms around the cursor; a plain wheel scrolls."""
        if event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            notches = event.angleDelta().y() / 120
            if notches:
                self.set_zoom(self.zoom() * WHEEL_ZOOM_PER_NOTCH**notches)
            event.accept()
            return
        super().wheelEvent(event)

    def changeEvent(self, event: QEvent) -> None:
        """Follow palette changes (light/dark switch) without rebuilding the scene."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._restyle()

    def _restyle(self) -> None:
        self._style = _Style.from_palette(self.palette())
        for item in self._nodes.values():
            self._style.apply_node(item)
        for edge in self._edges.values():
            self._style.apply_edge(edge)
        self.resetCachedContent()
