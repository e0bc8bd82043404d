"""The chat view: row snapshots, the diffing model, the bubble delegate and the view's actions."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from PySide6.QtCore import QEvent, QPoint, QRect, Qt
from PySide6.QtGui import QFocusEvent, QFont, QGuiApplication, QTextCursor
from PySide6.QtWidgets import QAbstractItemView, QApplication, QLabel, QPlainTextEdit, QWidget
from pytestqt.qtbot import QtBot

from app.chat.chat_model import ChatModel, ChatRole, MessageRow, rows_from_tree
from app.chat.chat_view import ChatView
from app.chat.message_delegate import MessageDelegate
from app.chat.message_editor import MessageEditor
from engine.core.tree import NodeStatus, Role, Tree

log = logging.getLogger(__name__)


# --- helpers -----------------------------------------------------------------------------


def branchy_tree() -> tuple[Tree, dict[str, int]]:
    """system → u1 → (a1, a1b*) → u2 → a2 (interrupted); a1b is the active version."""
    tree = Tree("You are terse.")
    u1 = tree.add_child(tree.root_id, Role.USER, "Hello **there**")
    a1 = tree.add_child(u1.id, Role.ASSISTANT, "Hi")
    a1b = tree.add_sibling(a1.id, "Hi, version two")
    u2 = tree.add_child(a1b.id, Role.USER, "Show `code`")
    a2 = tree.add_child(
        u2.id, Role.ASSISTANT, "```python\nprint(1)\n", status=NodeStatus.INTERRUPTED
    )
    return tree, {"u1": u1.id, "a1": a1.id, "a1b": a1b.id, "u2": u2.id, "a2": a2.id}


def make_rows(count: int, *, start_id: int = 1) -> list[MessageRow]:
    """`count` alternating user/assistant rows of varied length, some with Markdown code."""
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor"
    rows = []
    for i in range(count):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"Message {i}: " + " ".join([words] * (1 + i % 6))
        if i % 10 == 9:
            text += "\n\n```python\ndef f(x):\n    return x * 2\n```\n\nand `inline` code."
        rows.append(
            MessageRow(
                node_id=start_id + i,
                role=role,
                text=text,
                status="complete",
                variant=0,
                variants=1,
                checkpoint=None,
            )
        )
    return rows


def with_variants(row: MessageRow, variant: int, variants: int) -> MessageRow:
    return MessageRow(
        row.node_id, row.role, row.text, row.status, variant, variants, row.checkpoint
    )


@pytest.fixture
def view(qtbot: QtBot) -> Iterator[ChatView]:
    widget = ChatView()
    qtbot.addWidget(widget)
    widget.resize(640, 520)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget


def settle(qtbot: QtBot) -> None:
    """Let delayed layouts run."""
    qtbot.wait(1)
    QGuiApplication.processEvents()


# --- rows_from_tree ----------------------------------------------------------------------


def test_rows_from_tree_follows_the_active_path_with_versions_and_checkpoints() -> None:
    tree, ids = branchy_tree()
    rows = rows_from_tree(tree, {ids["u2"]: "before code"})
    assert [r.node_id for r in rows] == [ids["u1"], ids["a1b"], ids["u2"], ids["a2"]]
    assert [r.role for r in rows] == ["user", "assistant", "user", "assistant"]
    assert rows[0].text == "Hello **there**"
    assert (rows[1].variant, rows[1].variants) == (1, 2)
    assert all((r.variant, r.variants) == (0, 1) for r in (rows[0], rows[2], rows[3]))
    assert rows[3].status == "interrupted"
    assert [r.checkpoint for r in rows] == [None, None, "before code", None]
    assert rows_from_tree(tree)[2].checkpoint is None

    tree.switch_variant(ids["a1b"], 0)
    rows = rows_from_tree(tree)
    assert [r.node_id for r in rows] == [ids["u1"], ids["a1"]]
    assert (rows[1].variant, rows[1].variants) == (0, 2)
    assert rows_from_tree(Tree("only a system prompt")) == []


# --- the model ---------------------------------------------------------------------------


def test_model_passes_the_model_tester_through_changes(qtmodeltester) -> None:
    model = ChatModel()
    qtmodeltester.check(model)
    rows = make_rows(12)
    model.set_rows(rows)
    qtmodeltester.check(model)
    model.set_rows([*rows, *make_rows(1, start_id=100)])  # an appended reply
    qtmodeltester.check(model)
    model.set_rows(rows[:7])  # a removed tail
    qtmodeltester.check(model)
    edited = MessageRow(rows[6].node_id, rows[6].role, "changed", "streaming", 0, 1, None)
    changed = [*rows[:6], edited]
    model.set_rows(changed)  # a changed text
    qtmodeltester.check(model)
    model.update_text(rows[6].node_id, "changed again", "complete")
    qtmodeltester.check(model)
    model.set_rows(make_rows(5, start_id=500))  # another conversation: a reset
    qtmodeltester.check(model)
    model.set_rows([])
    qtmodeltester.check(model)


def test_model_data_roles_and_lookups() -> None:
    model = ChatModel()
    tree, ids = branchy_tree()
    model.set_rows(rows_from_tree(tree, {ids["a1b"]: "cp"}))
    assert model.rowCount() == 4
    assert model.rowCount(model.index(0, 0)) == 0
    index = model.index(1, 0)
    assert index.data() == "Hi, version two"
    assert index.data(ChatRole.TextRole) == "Hi, version two"
    assert index.data(ChatRole.NodeIdRole) == ids["a1b"]
    assert index.data(ChatRole.RoleRole) == "assistant"
    assert index.data(ChatRole.StatusRole) == "complete"
    assert index.data(ChatRole.VariantRole) == 1
    assert index.data(ChatRole.VariantsRole) == 2
    assert index.data(ChatRole.CheckpointRole) == "cp"
    assert index.data(Qt.ItemDataRole.DecorationRole) is None
    assert model.row_of(ids["u2"]) == 2
    assert model.row_of(ids["a1"]) is None
    assert model.row_at(3).status == "interrupted"
    with pytest.raises(IndexError):
        model.row_at(4)
    assert bytes(model.roleNames()[ChatRole.NodeIdRole]) == b"nodeId"


def test_appending_a_reply_inserts_exactly_one_row(qtbot: QtBot) -> None:
    model = ChatModel()
    rows = make_rows(10)
    model.set_rows(rows)
    resets: list[bool] = []
    removed: list[tuple[int, int]] = []
    changed: list[int] = []
    model.modelReset.connect(lambda: resets.append(True))
    model.rowsRemoved.connect(lambda _parent, first, last: removed.append((first, last)))
    model.dataChanged.connect(lambda top, _bottom, _roles: changed.append(top.row()))
    reply = make_rows(1, start_id=99)[0]
    with qtbot.waitSignal(model.rowsInserted, timeout=1000) as blocker:
        model.set_rows([*rows, reply])
    _parent, first, last = blocker.args
    assert (first, last) == (10, 10)
    assert model.rowCount() == 11 and model.row_at(10) == reply
    assert model.row_of(99) == 10
    assert not resets and not removed and not changed


def test_streaming_update_changes_only_that_row(qtbot: QtBot) -> None:
    model = ChatModel()
    rows = make_rows(6)
    model.set_rows(rows)
    target = rows[5].node_id
    seen: list[tuple[int, int, list[int]]] = []
    model.dataChanged.connect(
        lambda top, bottom, roles: seen.append((top.row(), bottom.row(), roles))
    )
    with qtbot.waitSignal(model.dataChanged, timeout=1000) as blocker:
        assert model.update_text(target, "The answer is", "streaming")
    top, bottom, roles = blocker.args
    assert (top.row(), bottom.row()) == (5, 5)
    assert ChatRole.TextRole in roles and Qt.ItemDataRole.DisplayRole in roles
    assert model.row_at(5).text == "The answer is" and model.row_at(5).status == "streaming"
    model.update_text(target, "The answer is 42.", "complete")
    assert [(t, b) for t, b, _ in seen] == [(5, 5), (5, 5)]
    assert ChatRole.StatusRole in seen[-1][2]
    assert not model.update_text(12345, "nobody", "complete")
    # The same rows again change nothing; a row whose text changed in set_rows: dataChanged.
    seen.clear()
    model.set_rows(model.rows())
    assert seen == []
    current = model.rows()
    current[2] = MessageRow(current[2].node_id, "user", "edited", "complete", 0, 1, "cp")
    model.set_rows(current)
    assert [(t, b) for t, b, _ in seen] == [(2, 2)]
    assert ChatRole.CheckpointRole in seen[0][2] and ChatRole.TextRole in seen[0][2]


def test_switching_a_middle_version_replaces_only_the_tail(qtbot: QtBot) -> None:
    model = ChatModel()
    tree, ids = branchy_tree()
    model.set_rows(rows_from_tree(tree))
    events: list[tuple[str, int, int]] = []
    model.rowsRemoved.connect(lambda _p, first, last: events.append(("removed", first, last)))
    model.rowsInserted.connect(lambda _p, first, last: events.append(("inserted", first, last)))
    model.modelReset.connect(lambda: events.append(("reset", 0, 0)))
    tree.switch_variant(ids["a1b"], 0)
    model.set_rows(rows_from_tree(tree))
    assert events == [("removed", 1, 3), ("inserted", 1, 1)]
    assert model.row_of(ids["a1"]) == 1 and model.row_of(ids["u2"]) is None


# --- the delegate ------------------------------------------------------------------------


def test_documents_render_markdown_with_monospaced_code(qtbot: QtBot) -> None:
    delegate = MessageDelegate()
    row = MessageRow(1, "assistant", "Use `len(x)`:\n\n```\nlen([1, 2])\n```", "complete", 0, 1)
    doc = delegate.document(row, 400)
    assert delegate.document(row, 400) is doc  # cached
    assert delegate.document(row, 300) is not doc  # another width, another layout
    assert "len(x)" in doc.toPlainText() and "`" not in doc.toPlainText()
    fixed = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            fixed.append(
                (
                    fragment.text(),
                    fragment.charFormat().fontFixedPitch()
                    or "monospace" in (fragment.charFormat().fontFamilies() or []),
                )
            )
            it += 1
        block = block.next()
    assert ("len(x)", True) in fixed
    assert any(text == "len([1, 2])" and mono for text, mono in fixed)


def test_the_document_cache_is_bounded_and_keeps_one_text_per_message(qapp: QApplication) -> None:
    delegate = MessageDelegate(cache_limit=8)
    text = ""
    for i in range(50):  # a streaming reply: only its latest text stays cached
        text += f"token{i} "
        delegate.document(MessageRow(7, "assistant", text, "streaming", 0, 1), 300)
    assert delegate.cache_size() == 1
    for node_id in range(100):
        delegate.document(MessageRow(node_id, "user", f"m{node_id}", "complete", 0, 1), 300)
    assert delegate.cache_size() == 8
    delegate.clear_cache()
    assert delegate.cache_size() == 0


def test_long_code_lines_wrap_inside_the_bubble(qapp: QApplication) -> None:
    delegate = MessageDelegate()
    code = "```\n" + "x" * 400 + " = " + "y" * 50 + "\n```\n\nand " + "z" * 300
    doc = delegate.document(MessageRow(1, "user", code, "complete", 0, 1), 300)
    assert doc.size().width() <= 301
    assert doc.size().height() > 5 * doc.defaultFont().pointSizeF()


def test_switcher_rects_are_empty_without_versions_and_ordered_with_them(
    qapp: QApplication
) -> None:
    delegate = MessageDelegate()
    rect = QRect(0, 100, 600, 120)
    single = MessageRow(1, "assistant", "x", "complete", 0, 1)
    assert all(r.isEmpty() for r in delegate.switcher_rects(rect, single))
    for role in ("user", "assistant"):
        left, right = delegate.switcher_rects(rect, MessageRow(1, role, "x", "complete", 0, 3))
        assert not left.isEmpty() and not right.isEmpty()
        assert left.right() < right.left()
        assert rect.contains(left) and rect.contains(right)
        assert right.top() < rect.top() + 40  # the header line, at the top right
        assert right.right() > rect.right() - 40


# --- the view ----------------------------------------------------------------------------


def test_view_setup(view: ChatView) -> None:
    assert view.verticalScrollMode() == QAbstractItemView.ScrollMode.ScrollPerPixel
    assert not view.uniformItemSizes()
    assert view.wordWrap()
    assert view.model() is view.chat_model
    assert view.itemDelegate() is view.delegate
    for name in ("edit", "regenerate", "rewind", "fork", "copy", "delete"):
        action = view.action(name)
        assert action.toolTip() and not action.shortcut().isEmpty()
        assert action.shortcutContext() == Qt.ShortcutContext.WidgetWithChildrenShortcut
        assert action in view.actions()
    assert view.edit_action.shortcut().toString() == "Ctrl+E"
    assert [seq.toString() for seq in view.edit_action.shortcuts()] == ["Ctrl+E", "F2"]
    assert view.regenerate_action.shortcut().toString() == "Ctrl+R"
    assert view.copy_action.shortcut().toString() == "Ctrl+Shift+C"
    assert view.delete_action.shortcut().toString() == "Del"
    assert not view.edit_action.isEnabled()  # nothing is current yet


def _rows_with_versions() -> list[MessageRow]:
    rows = make_rows(6)
    rows[1] = with_variants(rows[1], 0, 3)  # assistant, first of three
    rows[3] = with_variants(rows[3], 2, 3)  # assistant, last of three
    return rows


def test_alt_arrows_request_neighbouring_versions_in_range(qtbot: QtBot, view: ChatView) -> None:
    rows = _rows_with_versions()
    view.set_rows(rows)
    settle(qtbot)
    assert view.select_node(rows[1].node_id)
    with qtbot.waitSignal(view.variant_requested, timeout=1000) as blocker:
        qtbot.keyClick(view, Qt.Key.Key_Right, Qt.KeyboardModifier.AltModifier)
    assert blocker.args == [rows[1].node_id, 1]
    with qtbot.assertNotEmitted(view.variant_requested, wait=20):
        qtbot.keyClick(view, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)  # already first

    view.select_node(rows[3].node_id)
    with qtbot.waitSignal(view.variant_requested, timeout=1000) as blocker:
        qtbot.keyClick(view, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
    assert blocker.args == [rows[3].node_id, 1]
    with qtbot.assertNotEmitted(view.variant_requested, wait=20):
        qtbot.keyClick(view, Qt.Key.Key_Right, Qt.KeyboardModifier.AltModifier)  # already last

    view.select_node(rows[0].node_id)  # a single version: no switching either way
    assert not view.next_variant_action.isEnabled()
    with qtbot.assertNotEmitted(view.variant_requested, wait=20):
        qtbot.keyClick(view, Qt.Key.Key_Right, Qt.KeyboardModifier.AltModifier)
        qtbot.keyClick(view, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)


def test_clicking_the_switcher_arrows(qtbot: QtBot, view: ChatView) -> None:
    rows = _rows_with_versions()
    view.set_rows(rows)
    settle(qtbot)
    view.scroll_to_node(rows[1].node_id)  # the view follows the tail; show this one
    settle(qtbot)
    index = view.chat_model.index(1, 0)
    rect = view.visualRect(index)
    assert view.viewport().rect().contains(rect.topLeft())
    left, right = view.delegate.switcher_rects(rect, rows[1])
    with qtbot.waitSignal(view.variant_requested, timeout=1000) as blocker:
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=right.center())
    assert blocker.args == [rows[1].node_id, 1]
    with qtbot.assertNotEmitted(view.variant_requested, wait=20):
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=left.center())

    index = view.chat_model.index(3, 0)
    view.scrollTo(index)
    settle(qtbot)
    rect = view.visualRect(index)
    left, right = view.delegate.switcher_rects(rect, rows[3])
    with qtbot.waitSignal(view.variant_requested, timeout=1000) as blocker:
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=left.center())
    assert blocker.args == [rows[3].node_id, 1]
    with qtbot.assertNotEmitted(view.variant_requested, wait=20):
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=right.center())
        # A click in the text is a plain selection, not a switch.
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert view.currentIndex().row() == 3


def test_actions_emit_the_node_id(qtbot: QtBot, view: ChatView) -> None:
    tree, ids = branchy_tree()
    view.set_rows(rows_from_tree(tree))
    settle(qtbot)

    view.select_node(ids["u2"])
    assert not view.regenerate_action.isEnabled()
    menu = view.context_menu()
    assert view.regenerate_action not in menu.actions()
    assert view.edit_action in menu.actions() and view.delete_action in menu.actions()
    menu.deleteLater()
    for action, signal in (
        (view.edit_action, view.edit_started),
        (view.rewind_action, view.rewind_requested),
        (view.fork_action, view.fork_requested),
        (view.delete_action, view.delete_requested),
    ):
        with qtbot.waitSignal(signal, timeout=1000) as blocker:
            action.trigger()
        assert blocker.args == [ids["u2"]]
    with qtbot.assertNotEmitted(view.regenerate_requested, wait=10):
        view.regenerate_action.trigger()

    view.select_node(ids["a1b"])
    assert view.regenerate_action.isEnabled()
    menu = view.context_menu()
    assert view.regenerate_action in menu.actions()
    assert view.previous_variant_action in menu.actions()  # it has two versions
    menu.deleteLater()
    with qtbot.waitSignal(view.regenerate_requested, timeout=1000) as blocker:
        view.regenerate_action.trigger()
    assert blocker.args == [ids["a1b"]]
    QGuiApplication.clipboard().setText("something else")
    with qtbot.waitSignal(view.copy_requested, timeout=1000) as blocker:
        view.copy_action.trigger()
    assert blocker.args == [ids["a1b"]]
    assert QGuiApplication.clipboard().text() == "Hi, version two"
    with qtbot.waitSignal(view.variant_requested, timeout=1000) as blocker:
        view.previous_variant_action.trigger()
    assert blocker.args == [ids["a1b"], 0]

    # Keys reach the same actions.
    with qtbot.waitSignal(view.edit_started, timeout=1000) as blocker:
        qtbot.keyClick(view, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert blocker.args == [ids["a1b"]]
    with qtbot.waitSignal(view.delete_requested, timeout=1000) as blocker:
        qtbot.keyClick(view, Qt.Key.Key_Delete)
    assert blocker.args == [ids["a1b"]]

    # With the window active the keys go through Qt's shortcut map: still exactly one signal.
    view.cancel_edit()  # (a second Ctrl+E on the message being edited starts nothing)
    view.activateWindow()
    qtbot.waitActive(view)
    edits: list[int] = []
    view.edit_started.connect(edits.append)
    qtbot.keyClick(view, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    qtbot.wait(10)
    assert edits == [ids["a1b"]]

    view.set_rows([])
    assert not any(view.action(n).isEnabled() for n in ("edit", "copy", "delete", "regenerate"))


def test_follow_tail_while_streaming(qtbot: QtBot, view: ChatView) -> None:
    rows = make_rows(40)
    reply = MessageRow(1000, "assistant", "", "streaming", 0, 1)
    view.set_rows([*rows, reply])
    settle(qtbot)
    view.scroll_to_end()
    settle(qtbot)
    bar = view.verticalScrollBar()
    assert bar.maximum() > 0 and view.is_at_bottom()
    text = ""
    for i in range(30):
        text += f"word{i} " * 8 + "\n\n"
        view.update_text(1000, text, "streaming")
        settle(qtbot)
        assert view.is_at_bottom()
    grown = bar.maximum()

    # Scrolled up by the user: growing no longer moves the view.
    bar.setValue(bar.maximum() // 3)
    position = bar.value()
    for i in range(5):
        text += f"more{i} " * 10 + "\n\n"
        view.update_text(1000, text, "streaming")
        settle(qtbot)
    assert bar.maximum() > grown
    assert bar.value() == position and not view.is_at_bottom()

    assert view.scroll_to_node(rows[0].node_id)
    settle(qtbot)
    assert bar.value() == 0
    assert not view.scroll_to_node(424242)

    # Another conversation (a reset) opens at its end even when the last one was scrolled up.
    view.set_rows(make_rows(60, start_id=2000))
    settle(qtbot)
    assert view.is_at_bottom() and bar.maximum() > 0

    view.follow_tail = False
    view.scrollToTop()
    view.update_text(2059, "grown " * 400, "streaming")
    settle(qtbot)
    assert bar.value() == 0


def test_painting_every_kind_of_message(qtbot: QtBot, view: ChatView) -> None:
    view.set_rows(
        [
            MessageRow(1, "user", "Hi with `code`", "complete", 1, 2, "start"),
            MessageRow(2, "assistant", "# Title\n\n- a\n- b\n\n```\nx = 1\n```", "complete", 0, 1),
            MessageRow(3, "user", "Again", "complete", 0, 1),
            MessageRow(4, "assistant", "Half a rep", "interrupted", 0, 3),
            MessageRow(5, "user", "Go on", "complete", 0, 1),
            MessageRow(6, "assistant", "Typing", "streaming", 0, 1),
        ]
    )
    settle(qtbot)
    view.select_node(4)
    image = view.viewport().grab().toImage()
    assert not image.isNull()
    colours = {image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, 200, 7)}
    assert len(colours) > 3  # something was drawn
    user_rect = view.visualRect(view.chat_model.index(0, 0))
    assistant_rect = view.visualRect(view.chat_model.index(1, 0))
    # A short user bubble hugs the right; the assistant's starts at the left margin.
    left_probe = QPoint(view.delegate.MARGIN_H + 3, user_rect.center().y())
    assert image.pixel(left_probe) == image.pixel(QPoint(1, user_rect.center().y()))
    assistant_probe = QPoint(view.delegate.MARGIN_H + 3, assistant_rect.center().y())
    assert image.pixel(assistant_probe) != image.pixel(QPoint(1, assistant_rect.center().y()))


def test_a_thousand_messages(qtbot: QtBot, view: ChatView, record_property) -> None:
    rows = make_rows(1000)
    started = time.perf_counter()
    view.set_rows(rows)
    view.scroll_to_end()
    settle(qtbot)
    set_seconds = time.perf_counter() - started
    model = view.chat_model
    assert model.rowCount() == 1000
    assert view.is_at_bottom()
    bottom = view.indexAt(QPoint(20, view.viewport().height() - 20))
    assert bottom.isValid() and bottom.row() >= 995
    delegate = view.delegate
    assert 0 < delegate.cache_size() <= delegate.cache_limit

    bar = view.verticalScrollBar()
    step = view.viewport().height()
    positions = list(range(0, bar.maximum() + step, step))
    started = time.perf_counter()
    for value in positions:
        bar.setValue(min(value, bar.maximum()))
        view.viewport().grab()
    scroll_seconds = time.perf_counter() - started
    assert delegate.cache_size() <= delegate.cache_limit
    top = view.indexAt(QPoint(20, 10))
    assert top.isValid() and top.row() > 900

    # A second pass is served from the caches.
    started = time.perf_counter()
    for value in positions[::-1]:
        bar.setValue(min(value, bar.maximum()))
        view.viewport().grab()
    rescroll_seconds = time.perf_counter() - started

    # Streaming into the last of 1,000 rows: each token costs one relayout from the caches.
    reply = MessageRow(5000, "assistant", "", "streaming", 0, 1)
    view.set_rows([*rows, reply])
    view.scroll_to_end()
    settle(qtbot)
    started = time.perf_counter()
    text = ""
    for i in range(50):
        text += f"token{i} "
        view.update_text(5000, text, "streaming")
        settle(qtbot)
    stream_seconds = (time.perf_counter() - started) / 50
    assert view.is_at_bottom()
    assert delegate.cache_size() <= delegate.cache_limit

    message = (
        f"1,000 rows: set + layout + scroll to end {set_seconds * 1000:.0f} ms; "
        f"scroll through once ({len(positions)} pages, grab each) {scroll_seconds * 1000:.0f} ms; "
        f"again from cache {rescroll_seconds * 1000:.0f} ms; "
        f"one streamed token at the tail {stream_seconds * 1000:.1f} ms"
    )
    log.info(message)  # shown with --log-cli-level=INFO
    record_property("chat_view_timings", message)


# --- editing in place --------------------------------------------------------------------


def relayout(view: ChatView) -> None:
    """Run the view's pending layouts now: an editor's new width may change the height it
    wants, which takes one more pass (bounded: the width no longer changes then)."""
    for _ in range(3):
        view.doItemsLayout()


def open_editor(qtbot: QtBot, view: ChatView, node_id: int) -> MessageEditor:
    """Edit `node_id` through the edit action, as Ctrl+E or the context menu would."""
    assert view.select_node(node_id)
    with qtbot.waitSignal(view.edit_started, timeout=1000) as blocker:
        view.edit_action.trigger()
    assert blocker.args == [node_id]
    relayout(view)
    editor = view.editor()
    assert editor is not None
    return editor


def index_widgets(view: ChatView) -> list[QWidget]:
    model = view.chat_model
    widgets = (view.indexWidget(model.index(row, 0)) for row in range(model.rowCount()))
    return [w for w in widgets if w is not None]


def test_the_edit_action_opens_a_prefilled_editor_over_the_bubble(
    qtbot: QtBot, view: ChatView
) -> None:
    rows = make_rows(6)
    view.set_rows(rows)
    settle(qtbot)
    target = rows[2]
    index = view.chat_model.index(2, 0)
    plain_height = view.visualRect(index).height()

    editor = open_editor(qtbot, view, target.node_id)
    assert isinstance(editor, MessageEditor)
    assert view.editing_node == target.node_id == view.delegate.editing_node
    assert editor.text() == target.text
    assert isinstance(editor.text_edit, QPlainTextEdit)
    assert editor.text_edit.textCursor().atEnd()
    assert editor.isVisible() and editor.text_edit.font() == view.font()
    hint = editor.findChild(QLabel, "chat_edit_hint")
    assert hint is not None
    assert hint.text() == "Enter to submit · Shift+Enter new line · Esc to cancel"
    # Over the bubble's text, under its header, inside the (grown) row.
    rect = view.visualRect(index)
    assert rect.contains(editor.geometry())
    assert editor.geometry().top() > rect.top() + view.delegate.PADDING
    assert rect.height() > plain_height  # room for the hint and a spare line
    assert rect.height() >= editor.wanted_height()
    view.viewport().grab()  # paints the edited row (no text drawn under the editor)

    # F2 on another message moves the edit there; the first is cancelled.
    view.select_node(rows[1].node_id)
    with (
        qtbot.waitSignal(view.edit_cancelled, timeout=1000) as cancelled,
        qtbot.waitSignal(view.edit_started, timeout=1000) as started,
    ):
        qtbot.keyClick(view, Qt.Key.Key_F2)
    assert cancelled.args == [target.node_id] and started.args == [rows[1].node_id]
    assert view.editor() is not None and view.editor().text() == rows[1].text


def test_double_clicking_a_user_message_edits_it(qtbot: QtBot, view: ChatView) -> None:
    rows = make_rows(4)
    view.set_rows(rows)
    settle(qtbot)
    view.scroll_to_node(rows[0].node_id)
    settle(qtbot)
    assistant = view.visualRect(view.chat_model.index(1, 0))
    with qtbot.assertNotEmitted(view.edit_started, wait=20):
        qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=assistant.center())
    assert view.editor() is None

    user = view.visualRect(view.chat_model.index(0, 0))
    with qtbot.waitSignal(view.edit_started, timeout=1000) as blocker:
        qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=user.center())
    assert blocker.args == [rows[0].node_id]
    assert view.editor() is not None and view.editor().text() == rows[0].text
    assert view.currentIndex().row() == 0


def test_enter_submits_the_new_text_stripped_and_closes_the_editor(
    qtbot: QtBot, view: ChatView
) -> None:
    rows = make_rows(4)
    view.set_rows(rows)
    settle(qtbot)
    editor = open_editor(qtbot, view, rows[2].node_id)
    box = editor.text_edit
    box.selectAll()
    qtbot.keyClicks(box, "  A better question  ")
    assert view.chat_model.rows() == rows  # the editor never writes to the model
    with (
        qtbot.waitSignal(view.edit_submitted, timeout=1000) as blocker,
        qtbot.assertNotEmitted(view.edit_cancelled),
    ):
        qtbot.keyClick(box, Qt.Key.Key_Return)
    assert blocker.args == [rows[2].node_id, "A better question"]
    assert view.editor() is None and view.editing_node is None
    assert view.delegate.editing_node is None
    assert view.chat_model.rows() == rows  # the owner applies the edit, not the view


def test_shift_enter_is_a_new_line_and_esc_cancels(qtbot: QtBot, view: ChatView) -> None:
    rows = make_rows(4)
    view.set_rows(rows)
    settle(qtbot)
    editor = open_editor(qtbot, view, rows[0].node_id)
    box = editor.text_edit
    with qtbot.assertNotEmitted(view.edit_submitted), qtbot.assertNotEmitted(view.edit_cancelled):
        qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
        qtbot.keyClicks(box, "second line")
    assert editor.text() == rows[0].text + "\nsecond line"
    with (
        qtbot.waitSignal(view.edit_cancelled, timeout=1000) as blocker,
        qtbot.assertNotEmitted(view.edit_submitted),
    ):
        qtbot.keyClick(box, Qt.Key.Key_Escape)
    assert blocker.args == [rows[0].node_id]
    assert view.editor() is None and view.editing_node is None


def test_an_unchanged_or_blank_text_only_closes_the_editor(qtbot: QtBot, view: ChatView) -> None:
    rows = make_rows(4)
    view.set_rows(rows)
    settle(qtbot)
    editor = open_editor(qtbot, view, rows[2].node_id)
    qtbot.keyClicks(editor.text_edit, "   ")  # only trailing spaces: the same text
    with (
        qtbot.assertNotEmitted(view.edit_submitted),
        qtbot.waitSignal(view.edit_cancelled, timeout=1000) as blocker,
    ):
        qtbot.keyClick(editor.text_edit, Qt.Key.Key_Return)
    assert blocker.args == [rows[2].node_id] and view.editor() is None

    editor = open_editor(qtbot, view, rows[2].node_id)
    editor.text_edit.selectAll()
    qtbot.keyClick(editor.text_edit, Qt.Key.Key_Delete)
    qtbot.keyClicks(editor.text_edit, " \t ")
    with (
        qtbot.assertNotEmitted(view.edit_submitted),
        qtbot.waitSignal(view.edit_cancelled, timeout=1000),
    ):
        qtbot.keyClick(editor.text_edit, Qt.Key.Key_Enter)
    assert view.editor() is None


def test_one_editor_at_a_time_and_never_a_widget_per_message(qtbot: QtBot, view: ChatView) -> None:
    rows = make_rows(200)
    view.set_rows(rows)
    view.scroll_to_end()
    settle(qtbot)
    assert view.findChildren(QPlainTextEdit) == [] and index_widgets(view) == []

    first = open_editor(qtbot, view, rows[190].node_id)
    assert len(view.findChildren(QPlainTextEdit)) == 1 and index_widgets(view) == [first]
    with qtbot.waitSignal(view.edit_cancelled, timeout=1000) as blocker:
        assert view.start_edit(rows[10].node_id)
    assert blocker.args == [rows[190].node_id]
    relayout(view)
    second = view.editor()
    assert second is not None and second is not first
    assert index_widgets(view) == [second] and view.editing_node == rows[10].node_id
    assert view.visualRect(view.chat_model.index(10, 0)).intersects(view.viewport().rect())
    with qtbot.assertNotEmitted(view.edit_started, wait=10):
        assert view.start_edit(rows[10].node_id)  # the one already open: nothing new
    assert view.editor() is second
    assert not view.start_edit(424242)

    with qtbot.waitSignal(view.edit_cancelled, timeout=1000):
        view.cancel_edit()
    assert index_widgets(view) == []
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # closed editors go later
    assert view.findChildren(QPlainTextEdit) == []
    with qtbot.assertNotEmitted(view.edit_cancelled, wait=10):
        view.cancel_edit()  # nothing open: nothing to report


def test_the_row_grows_with_the_text_up_to_a_cap(qtbot: QtBot, view: ChatView) -> None:
    rows = [MessageRow(1, "user", "Short", "complete", 0, 1), *make_rows(3, start_id=2)]
    view.set_rows(rows)
    settle(qtbot)
    editor = open_editor(qtbot, view, 1)
    index = view.chat_model.index(0, 0)
    small = view.visualRect(index).height()
    box = editor.text_edit
    for _ in range(3):
        qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    relayout(view)
    grown = view.visualRect(index).height()
    assert grown >= small + 3 * box.fontMetrics().lineSpacing()
    assert box.verticalScrollBar().maximum() == 0  # it all shows, with room to spare

    box.insertPlainText("\n".join(f"line {i}" for i in range(200)))  # a paste
    relayout(view)
    capped = view.visualRect(index).height()
    assert grown < capped < view.viewport().height()
    assert box.verticalScrollBar().maximum() > 0  # the rest scrolls inside the editor
    assert view.visualRect(index).contains(editor.geometry())


def test_the_editor_survives_focus_loss_and_row_updates(qtbot: QtBot, view: ChatView) -> None:
    rows = make_rows(6)
    view.set_rows(rows)
    settle(qtbot)
    target = rows[2].node_id
    editor = open_editor(qtbot, view, target)
    qtbot.keyClicks(editor.text_edit, " and more")
    typed = editor.text()
    with qtbot.assertNotEmitted(view.edit_cancelled), qtbot.assertNotEmitted(view.edit_submitted):
        for widget in (editor.text_edit, editor):
            QApplication.sendEvent(widget, QFocusEvent(QEvent.Type.FocusOut))
        view.setFocus()
        # A reply streams in below; the edited message gets a new version count.
        reply = MessageRow(900, "assistant", "", "streaming", 0, 1)
        view.set_rows([*rows[:2], with_variants(rows[2], 0, 2), *rows[3:], reply])
        view.update_text(900, "Partial answer", "streaming")
        view.set_rows(rows[:4])  # a tail after it removed
        relayout(view)
        assert view.editor() is editor and editor.text() == typed
        # A reset that keeps the message (a new first row): the editor reopens, text intact.
        view.set_rows([make_rows(1, start_id=700)[0], *rows[1:4]])
        relayout(view)
    assert view.editing_node == target
    assert view.editor() is not None and view.editor().text() == typed
    assert len(index_widgets(view)) == 1

    with qtbot.waitSignal(view.edit_cancelled, timeout=1000) as blocker:
        view.set_rows(rows[:2])  # the edited message is gone
    assert blocker.args == [target]
    assert view.editor() is None and view.editing_node is None
    assert view.delegate.editing_node is None

    open_editor(qtbot, view, rows[0].node_id)
    with qtbot.waitSignal(view.edit_cancelled, timeout=1000) as blocker:
        view.set_rows(make_rows(3, start_id=500))  # another conversation
    assert blocker.args == [rows[0].node_id] and view.editor() is None
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert view.findChildren(QPlainTextEdit) == []


_CTRL_SHIFT = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier


def test_the_views_keys_stay_in_the_editor(qtbot: QtBot, view: ChatView) -> None:
    rows = _rows_with_versions()
    view.set_rows(rows)
    settle(qtbot)
    view.activateWindow()
    qtbot.waitActive(view)
    editor = open_editor(qtbot, view, rows[3].node_id)  # an assistant reply, 3 versions
    box = editor.text_edit
    box.setFocus()
    assert box.hasFocus()
    box.moveCursor(QTextCursor.MoveOperation.Start)
    before = editor.text()
    with (
        qtbot.assertNotEmitted(view.delete_requested),
        qtbot.assertNotEmitted(view.rewind_requested),
        qtbot.assertNotEmitted(view.variant_requested),
        qtbot.assertNotEmitted(view.edit_cancelled),
        qtbot.assertNotEmitted(view.copy_requested),
    ):
        qtbot.keyClick(box, Qt.Key.Key_Delete)  # deletes a character, not the branch
        qtbot.keyClick(box, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
        qtbot.keyClick(box, Qt.Key.Key_C, _CTRL_SHIFT)
        qtbot.keyClick(box, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
        box.moveCursor(QTextCursor.MoveOperation.End)
        qtbot.keyClick(box, Qt.Key.Key_Backspace, Qt.KeyboardModifier.ControlModifier)
    assert editor.text() != before and editor.text() == before[1:].rsplit(" ", 1)[0] + " "
    assert view.editor() is editor


def test_a_new_font_reaches_the_editor(qtbot: QtBot, view: ChatView) -> None:
    view.set_rows(make_rows(3))
    settle(qtbot)
    editor = open_editor(qtbot, view, 1)
    wanted = editor.wanted_height()
    font = QFont(view.font())
    font.setPointSizeF(font.pointSizeF() * 2)
    view.setFont(font)
    relayout(view)
    assert editor.text_edit.font().pointSizeF() == font.pointSizeF()
    assert editor.wanted_height() > wanted
    assert view.visualRect(view.chat_model.index(0, 0)).contains(editor.geometry())
