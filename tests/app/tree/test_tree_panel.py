"""The tree panel: one item per node and edge, the active path highlighted, checkpoint badges,
clicks, a tidy layout, 1,000-node trees and clamped zoom."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QColor, QPalette, QWheelEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.tree.tree_panel import (
    MAX_ZOOM,
    MIN_ZOOM,
    NODE_RADIUS,
    PanelNode,
    TreePanel,
    panel_nodes_from_tree,
    preview,
)
from engine.core.tree import Role, Tree


def branchy_tree() -> tuple[Tree, dict[str, int]]:
    """root ─ u1 ─ a1 ─ u2 ─ a2          (u1 has a second version u1b with its own reply)
                     └ u3 ─ a3 ─ u4   (a deeper branch off a1)
            └ u1b ─ a1b
    The active path ends at u4."""
    tree = Tree("You are helpful.")
    ids: dict[str, int] = {}
    ids["u1"] = tree.add_child(tree.root_id, Role.USER, "Hello there").id
    ids["a1"] = tree.add_child(ids["u1"], Role.ASSISTANT, "Hi! How can I help?").id
    ids["u2"] = tree.add_child(ids["a1"], Role.USER, "Tell me a joke").id
    ids["a2"] = tree.add_child(ids["u2"], Role.ASSISTANT, "Why did the tree...").id
    ids["u1b"] = tree.add_sibling(ids["u1"], "Hello, <b>again</b>").id
    ids["a1b"] = tree.add_child(ids["u1b"], Role.ASSISTANT, "Welcome back.").id
    ids["u3"] = tree.add_child(ids["a1"], Role.USER, "Actually, explain\n  recursion " * 5).id
    ids["a3"] = tree.add_child(ids["u3"], Role.ASSISTANT, "See: recursion.").id
    ids["u4"] = tree.add_child(ids["a3"], Role.USER, "Funny.").id
    tree.set_active(ids["u4"])
    return tree, ids


@pytest.fixture
def panel(qtbot: QtBot) -> TreePanel:
    view = TreePanel()
    view.resize(500, 400)
    qtbot.addWidget(view)
    view.show()
    qtbot.waitExposed(view)
    return view


def show_tree(panel: TreePanel, tree: Tree, checkpoints: dict[int, str] | None = None) -> None:
    panel.set_tree(
        panel_nodes_from_tree(tree, checkpoints), [n.id for n in tree.active_path()]
    )


def random_nodes(count: int, seed: int) -> list[PanelNode]:
    """A seeded random tree: each new node hangs under a random earlier one, biased to recent
    nodes so there are long chains as well as bushy spots."""
    rng = random.Random(seed)
    nodes = [PanelNode(0, None, "system", "System prompt", None)]
    for node_id in range(1, count):
        parent = max(0, node_id - 1 - int(rng.expovariate(0.2)))
        role = "user" if nodes[parent].role != "user" else "assistant"
        checkpoint = rng.choice([None, None, None, "ram", "disk"])
        nodes.append(PanelNode(node_id, parent, role, f"message {node_id}", checkpoint))
    return nodes


def active_leaf_path(nodes: list[PanelNode]) -> list[int]:
    parents = {n.id: n.parent for n in nodes}
    path: list[int] = []
    current: int | None = nodes[-1].id
    while current is not None:
        path.append(current)
        current = parents[current]
    return path[::-1]


def assert_no_overlap(panel: TreePanel) -> None:
    rows: dict[float, list[float]] = defaultdict(list)
    for item in panel.node_items().values():
        rows[item.pos().y()].append(item.pos().x())
    for xs in rows.values():
        xs.sort()
        for left, right in itertools.pairwise(xs):
            assert right - left > 2 * NODE_RADIUS
    ys = sorted(rows)
    for top, bottom in itertools.pairwise(ys):
        assert bottom - top > 2 * NODE_RADIUS


# --- panel_nodes_from_tree ------------------------------------------------------------


def test_panel_nodes_follow_the_tree() -> None:
    tree, ids = branchy_tree()
    nodes = panel_nodes_from_tree(tree, {ids["a1"]: "ram", ids["u3"]: "disk", 999: "ram"})
    by_id = {n.id: n for n in nodes}
    assert set(by_id) == {n.id for n in tree.nodes()}
    assert by_id[tree.root_id].role == "system"
    assert by_id[tree.root_id].label == "You are helpful."
    assert by_id[ids["u1"]] == PanelNode(ids["u1"], tree.root_id, "user", "Hello there", None)
    assert by_id[ids["a1"]].checkpoint == "ram"
    assert by_id[ids["u3"]].checkpoint == "disk"
    long_label = by_id[ids["u3"]].label
    assert "\n" not in long_label and len(long_label) <= 40 and long_label.endswith("…")
    # Parents come before children; siblings keep the tree's order.
    position = {n.id: i for i, n in enumerate(nodes)}
    assert position[ids["u1"]] < position[ids["u1b"]]
    assert position[ids["u2"]] < position[ids["u3"]]
    assert all(position[n.parent] < position[n.id] for n in nodes if n.parent is not None)


def test_an_empty_system_prompt_is_labelled() -> None:
    assert panel_nodes_from_tree(Tree(""))[0].label == "System prompt"
    assert preview("  a\n\tb  ") == "a b"
    with pytest.raises(ValueError, match="checkpoint"):
        panel_nodes_from_tree(Tree(""), {0: "gpu"})


# --- drawing --------------------------------------------------------------------------


def test_one_item_per_node_and_edge_with_the_active_path_highlighted(panel: TreePanel) -> None:
    tree, ids = branchy_tree()
    show_tree(panel, tree, {ids["a1"]: "ram", ids["a1b"]: "disk"})
    nodes = panel.node_items()
    edges = panel.edge_items()
    assert set(nodes) == {n.id for n in tree.nodes()}
    assert set(edges) == {n.id for n in tree.nodes() if n.parent is not None}
    for child_id, edge in edges.items():
        assert edge.parent_id == tree.node(child_id).parent
    # Exactly the active path is highlighted, nodes and the edges between them.
    active = {n.id for n in tree.active_path()}
    assert active == {tree.root_id, ids["u1"], ids["a1"], ids["u3"], ids["a3"], ids["u4"]}
    assert {i for i, item in nodes.items() if item.highlighted} == active
    assert {i for i, edge in edges.items() if edge.highlighted} == active - {tree.root_id}
    accent = panel.palette().color(QPalette.ColorRole.Highlight)
    assert panel.node_item(ids["u4"]).pen().color() == accent
    assert panel.node_item(ids["a2"]).pen().color() != accent
    assert edges[ids["u4"]].pen().color() == accent
    assert edges[ids["u4"]].pen().widthF() > edges[ids["a2"]].pen().widthF()
    # User, assistant and system are drawn differently.
    fills = {
        role: panel.node_item(node_id).brush().color().name()
        for role, node_id in (("system", tree.root_id), ("user", ids["u1"]),
                              ("assistant", ids["a1"]))
    }
    assert len(set(fills.values())) == 3
    # Checkpoint badges: filled for RAM, outlined (base-coloured) for disk, none elsewhere.
    ram, disk = panel.node_item(ids["a1"]), panel.node_item(ids["a1b"])
    assert ram.checkpoint == "ram" and ram.badge is not None
    assert disk.checkpoint == "disk" and disk.badge is not None
    assert ram.badge.brush().color() == disk.badge.pen().color()
    assert disk.badge.brush().color() == panel.palette().color(QPalette.ColorRole.Base)
    assert ram.badge.brush().color() != disk.badge.brush().color()
    assert all(item.badge is None for i, item in nodes.items() if i not in (ids["a1"], ids["a1b"]))
    assert len(panel.scene().items()) == len(nodes) + len(edges) + 2
    # Tooltips name the role and show the label, markup escaped.
    tip = panel.node_item(ids["u1b"]).toolTip()
    assert "User" in tip and "Hello, &lt;b&gt;again&lt;/b&gt;" in tip
    assert "RAM" in ram.toolTip() and "disk" in disk.toolTip()


def test_set_tree_replaces_the_drawing(panel: TreePanel) -> None:
    tree, ids = branchy_tree()
    show_tree(panel, tree)
    tree.delete_branch(ids["u3"])
    tree.add_child(ids["a2"], Role.USER, "and another")
    show_tree(panel, tree)
    assert set(panel.node_items()) == {n.id for n in tree.nodes()}
    assert len(panel.scene().items()) == 2 * len(tree) - 1
    assert panel.node_item(tree.active_leaf).highlighted
    assert not panel.node_item(ids["u1b"]).highlighted
    with pytest.raises(KeyError):
        panel.node_item(ids["u3"])
    panel.set_tree([], [])
    assert panel.scene().items() == []


def drawing(panel: TreePanel) -> dict[str, object]:
    """Everything visible about a drawing, to compare an updated panel with a fresh one."""
    nodes = {
        node_id: (
            (item.pos().x(), item.pos().y()), item.zValue(), item.role, item.label,
            item.highlighted, item.checkpoint, item.toolTip(), item.pen().color().name(),
            item.pen().widthF(), item.brush().color().name(),
            None if item.badge is None else (
                item.badge.rect().getRect(), item.badge.brush().color().name(),
                item.badge.brush().style(), item.badge.pen().color().name(),
            ),
        )
        for node_id, item in panel.node_items().items()
    }
    edges = {
        child: (edge.parent_id,
                (edge.line().x1(), edge.line().y1(), edge.line().x2(), edge.line().y2()),
                edge.highlighted, edge.zValue(), edge.pen().color().name(), edge.pen().widthF())
        for child, edge in panel.edge_items().items()
    }
    return {
        "nodes": nodes, "edges": edges, "items": len(panel.scene().items()),
        "rect": panel.scene().sceneRect().getRect(),
    }


def test_an_updated_drawing_equals_a_fresh_one(panel: TreePanel, qtbot: QtBot) -> None:
    fresh = TreePanel()
    qtbot.addWidget(fresh)
    tree, ids = branchy_tree()
    show_tree(panel, tree, {ids["a1"]: "ram", ids["u2"]: "disk", ids["a3"]: "ram"})
    kept = panel.node_item(ids["a2"])
    # Insert a sibling in the middle (shifts columns), drop a branch, move the active path,
    # and change every kind of checkpoint transition.
    tree.add_sibling(ids["u2"], "Another joke")
    tree.delete_branch(ids["u1b"])
    tree.switch_variant(ids["u2"], 0)
    checkpoints = {ids["a1"]: "disk", ids["a2"]: "ram", ids["u3"]: "ram"}
    show_tree(panel, tree, checkpoints)
    show_tree(fresh, tree, checkpoints)
    assert drawing(panel) == drawing(fresh)
    assert panel.node_item(ids["a2"]) is kept  # reused, not rebuilt
    # A different conversation reuses the ids 0, 1, 2... with other roles and texts.
    other = Tree("")
    a = other.add_child(other.root_id, Role.USER, "first")
    other.add_child(a.id, Role.USER, "second version? no: a user after a user")
    other.add_child(other.root_id, Role.USER, "elsewhere")
    show_tree(panel, other, {0: "ram"})
    show_tree(fresh, other, {0: "ram"})
    assert drawing(panel) == drawing(fresh)


def test_bad_input_is_rejected_and_keeps_the_old_drawing(panel: TreePanel) -> None:
    tree, _ = branchy_tree()
    show_tree(panel, tree)
    with pytest.raises(ValueError, match="twice"):
        panel.set_tree([PanelNode(0, None, "system", "", None)] * 2, [])
    with pytest.raises(ValueError, match="role"):
        panel.set_tree([PanelNode(0, None, "robot", "", None)], [])
    assert len(panel.node_items()) == len(tree)


def test_clicking_a_node_emits_its_id(panel: TreePanel, qtbot: QtBot) -> None:
    tree, ids = branchy_tree()
    show_tree(panel, tree, {ids["a1b"]: "ram"})
    for name in ("a1b", "u2", "u4"):
        item = panel.node_item(ids[name])
        panel.center_on_node(ids[name])
        pos = panel.mapFromScene(item.sceneBoundingRect().center())
        with qtbot.waitSignal(panel.node_clicked, timeout=1000) as blocker:
            qtbot.mouseClick(panel.viewport(), Qt.MouseButton.LeftButton, pos=pos)
        assert blocker.args == [ids[name]]
    # The badge belongs to its node.
    badge = panel.node_item(ids["a1b"]).badge
    assert badge is not None
    badge_pos = panel.mapFromScene(badge.sceneBoundingRect().center())
    assert panel.node_at(badge_pos) == ids["a1b"]


def test_clicking_empty_space_emits_nothing(panel: TreePanel, qtbot: QtBot) -> None:
    tree, _ = branchy_tree()
    show_tree(panel, tree)
    clicked: list[int] = []
    panel.node_clicked.connect(clicked.append)
    qtbot.mouseClick(panel.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(2, 2))
    assert clicked == []
    assert panel.dragMode() == panel.DragMode.ScrollHandDrag


def test_layout_is_tidy(panel: TreePanel) -> None:
    tree, ids = branchy_tree()
    show_tree(panel, tree)
    items = panel.node_items()
    for node in tree.nodes():
        item = items[node.id]
        kids = [items[k].pos() for k in node.children]
        # Children are one row below their parent, left to right in tree order.
        assert all(kid.y() > item.pos().y() for kid in kids)
        assert len({kid.y() for kid in kids}) <= 1
        assert [kid.x() for kid in kids] == sorted(kid.x() for kid in kids)
        assert len({kid.x() for kid in kids}) == len(kids)
        # A parent is centred over its children.
        if kids:
            assert item.pos().x() == pytest.approx((kids[0].x() + kids[-1].x()) / 2)
    root = items[tree.root_id].pos()
    assert all(item.pos().y() >= root.y() for item in items.values())
    assert items[ids["u1"]].pos().x() < items[ids["u1b"]].pos().x()
    assert_no_overlap(panel)
    # The whole drawing is inside the scene rect.
    rect = panel.scene().sceneRect()
    assert all(rect.contains(item.sceneBoundingRect()) for item in items.values())


def test_a_long_chain_does_not_recurse(panel: TreePanel) -> None:
    nodes = [PanelNode(0, None, "system", "", None)]
    nodes += [PanelNode(i, i - 1, "user" if i % 2 else "assistant", str(i), None)
              for i in range(1, 3000)]
    panel.set_tree(nodes, [n.id for n in nodes])
    assert len(panel.node_items()) == 3000
    assert {item.pos().x() for item in panel.node_items().values()} == {
        panel.node_item(0).pos().x()
    }


def test_a_thousand_nodes(panel: TreePanel) -> None:
    nodes = random_nodes(1000, seed=7)
    path = active_leaf_path(nodes)
    panel.set_tree(nodes, path)
    badges = sum(n.checkpoint is not None for n in nodes)
    assert len(panel.node_items()) == 1000
    assert len(panel.edge_items()) == 999
    assert len(panel.scene().items()) == 1000 + 999 + badges
    assert sum(item.highlighted for item in panel.node_items().values()) == len(path)
    assert_no_overlap(panel)
    # Again, with another active path and a few more nodes, as after a change.
    more = random_nodes(1010, seed=7)
    path = active_leaf_path(more[:500])
    panel.set_tree(more, path)
    badges = sum(n.checkpoint is not None for n in more)
    assert len(panel.scene().items()) == 1010 + 1009 + badges
    assert {i for i, item in panel.node_items().items() if item.highlighted} == set(path)
    panel.center_on_node(path[-1])
    leaf = panel.node_item(path[-1])
    assert panel.viewport().rect().contains(panel.mapFromScene(leaf.scenePos()))
    panel.viewport().grab()  # paints the whole visible part without complaint


def test_center_on_node_scrolls_to_it(panel: TreePanel) -> None:
    nodes = random_nodes(400, seed=3)
    panel.set_tree(nodes, [])
    far = max(panel.node_items().values(), key=lambda item: item.pos().x() + item.pos().y())
    panel.center_on_node(0)
    panel.center_on_node(far.node_id)
    assert panel.viewport().rect().contains(panel.mapFromScene(far.scenePos()))
    panel.center_on_node(123456)  # unknown: ignored


def test_zoom_is_clamped(panel: TreePanel) -> None:
    tree, _ = branchy_tree()
    show_tree(panel, tree)
    assert panel.zoom() == pytest.approx(1.0)
    panel.zoom_in()
    assert panel.zoom() > 1.0
    assert panel.transform().m22() == pytest.approx(panel.zoom())
    panel.reset_zoom()
    panel.zoom_out()
    assert panel.zoom() < 1.0
    for _ in range(50):
        panel.zoom_in()
    assert panel.zoom() == pytest.approx(MAX_ZOOM)
    for _ in range(100):
        panel.zoom_out()
    assert panel.zoom() == pytest.approx(MIN_ZOOM)
    panel.reset_zoom()
    assert panel.zoom() == pytest.approx(1.0)
    # Zoom survives a set_tree.
    panel.zoom_in()
    show_tree(panel, tree)
    assert panel.zoom() > 1.0


def _wheel(panel: TreePanel, delta: int, modifiers: Qt.KeyboardModifier) -> None:
    centre = QPointF(panel.viewport().rect().center())
    event = QWheelEvent(
        centre, panel.viewport().mapToGlobal(centre), QPoint(0, 0), QPoint(0, delta),
        Qt.MouseButton.NoButton, modifiers, Qt.ScrollPhase.NoScrollPhase, False,
    )
    QApplication.sendEvent(panel.viewport(), event)


def test_ctrl_wheel_zooms_and_plain_wheel_does_not(panel: TreePanel) -> None:
    panel.set_tree(random_nodes(300, seed=1), [])
    _wheel(panel, 120, Qt.KeyboardModifier.ControlModifier)
    assert panel.zoom() > 1.0
    _wheel(panel, -240, Qt.KeyboardModifier.ControlModifier)
    assert panel.zoom() < 1.0
    before = panel.zoom()
    _wheel(panel, -120, Qt.KeyboardModifier.NoModifier)
    assert panel.zoom() == pytest.approx(before)
    for _ in range(60):
        _wheel(panel, 120, Qt.KeyboardModifier.ControlModifier)
    assert panel.zoom() == pytest.approx(MAX_ZOOM)


def test_colours_follow_the_palette(panel: TreePanel) -> None:
    tree, ids = branchy_tree()
    show_tree(panel, tree)
    dark = QPalette(panel.palette())
    dark.setColor(QPalette.ColorRole.Base, QColor("#1e1e1e"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#eeeeee"))
    dark.setColor(QPalette.ColorRole.Link, QColor("#4aa3ff"))
    dark.setColor(QPalette.ColorRole.Highlight, QColor("#ff8800"))
    panel.setPalette(dark)
    assert panel.node_item(ids["u1"]).brush().color() == QColor("#4aa3ff")
    assert panel.node_item(ids["u4"]).pen().color() == QColor("#ff8800")
    assert panel.edge_items()[ids["u4"]].pen().color() == QColor("#ff8800")


def test_a_tool_call_and_its_result_are_drawn_like_any_node(panel: TreePanel) -> None:
    """API conversations with tools: a `tool` node has its own fill, not an error."""
    nodes = [PanelNode(0, None, "system", "", None), PanelNode(1, 0, "user", "", None),
             PanelNode(2, 1, "assistant", "", None), PanelNode(3, 2, "tool", "", None)]
    panel.set_tree(nodes, [0, 1, 2, 3])
    assert len(panel.node_items()) == 4
