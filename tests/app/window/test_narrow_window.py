"""The window at 1280 and 1400 px wide, as a new user first sees it: a screenshot whose text is
measured against its widgets (font metrics, not pixels by eye). The model is named as people
know it; the status bar's step text is cut with "…" before the permanent widgets instead of
running into the checkpoint text; no two status bar widgets overlap; the context gauge's text
fits its bar; a long conversation title is elided in the sidebar, which never scrolls sideways;
and a download left unfinished by an earlier run is offered at start."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication, QLabel, QWidget
from pytestqt.qtbot import QtBot

from app.look.elided_label import ElidedLabel
from app.window.main_window import MainWindow
from app.window.message_bar import MessageBar
from engine.config.overrides import Overrides
from engine.config.settings import Settings
from engine.core.overflow import Overflow
from engine.core.tree import Role, Tree
from engine.files.paths import data_dirs
from engine.models.download import Downloader
from engine.models.download_transfer import Progress
from engine.models.hub import HubClient
from engine.models.remote import Hub, HubCancelledError
from engine.storage.store import Store
from tests.app_fixtures import TIMEOUT, destroy
from tests.engine.models.fake_hub import FakeHubServer

# The window at 1280 and 1400 px on the real engine, with the bundled model's real name.
pytestmark = pytest.mark.engine_process

LONG_TITLE = ("The Danube from its source in the Black Forest to its delta on the Black Sea, "
              "with every capital on the way")
STEP = ("Reply: 41 of 45 tokens reused from a checkpoint, 4 read at 210 tokens/s, 96 "
        "generated at 35.2 tokens/s; checkpoint saved (1.2 MiB)")
MESSAGES = [("user", "Where does the Danube begin, and which countries does it cross? " * 6),
            ("assistant", "In the Black Forest; it crosses ten countries on its way east. " * 6),
            ("user", "Which capitals stand on it? " * 8),
            ("assistant", "Vienna, Bratislava, Budapest and Belgrade. " * 8),
            ("user", "What lives in the delta? " * 8),
            ("assistant", "Pelicans, about 300 species of birds and 45 of fish. " * 8)]


@pytest.fixture
def unfinished(tiny_models: dict[str, Path]) -> None:
    """A part of a download an earlier run did not finish, in the models folder."""
    data = tiny_models["dense"].read_bytes()
    with FakeHubServer() as hub:
        hub.add_repo("arbor-test/tiny-GGUF", {"tiny-dense-F32.gguf": data})
        client = HubClient(Hub(hub.url))
        details = client.details("arbor-test/tiny-GGUF")
        [remote] = client.remote_files(details, details.group("F32"))
        cancel = threading.Event()

        def stop(p: Progress) -> None:
            if p.done >= 1 << 20:
                cancel.set()

        with pytest.raises(HubCancelledError):
            Downloader(data_dirs().models, client.hub).download(remote, progress=stop,
                                                                cancel=cancel)


@pytest.fixture
def narrow_window(qtbot: QtBot, tmp_path: Path, smollm2_path: Path,
                  unfinished: None) -> Iterator[MainWindow]:
    store = Store(tmp_path / "conversations.db")
    tree = Tree("You are a geographer.")
    for role, text in MESSAGES:
        tree.add_child(tree.active_leaf, Role(role), text)
    cid = store.create(tree, title=LONG_TITLE)
    store.set_settings(cid, Overrides(overflow=Overflow.DROP_OLDEST).write({}))
    win = MainWindow(store=store, settings=Settings(n_ctx=512, max_tokens=64))
    qtbot.addWidget(win)
    win.show()
    with qtbot.waitSignal(win.model_ready, timeout=TIMEOUT):
        win.models.load_model(str(smollm2_path))
    yield win
    win.close()
    destroy(win)


def _fits(label: QLabel) -> bool:
    shown = label.shown_text() if isinstance(label, ElidedLabel) else label.text()
    return label.fontMetrics().horizontalAdvance(shown) <= label.contentsRect().width()


@pytest.mark.parametrize("width", [1280, 1400])
def test_the_status_bar_gauge_and_sidebar_fit_their_text(
        qtbot: QtBot, narrow_window: MainWindow, width: int, tmp_path: Path) -> None:
    win = narrow_window
    win.resize(width, 760)
    win.status.message(STEP)
    QApplication.processEvents()
    win.grab().save(str(tmp_path / f"window-{width}.png"))  # paints every part
    bar = win.statusBar()
    assert isinstance(bar, MessageBar)

    model = win.status.model_label
    assert model.text().startswith("SmolLM2 135M Instruct · Q4_1 · ")
    assert "Smollm2 135M 8k" in model.toolTip()  # the header's name, for who wants it

    widgets: list[QWidget] = [w for w in bar.findChildren(QWidget)
                              if w.isVisible() and w.parent() is bar and w.width() > 0]
    widgets.sort(key=lambda w: w.x())
    for left, right in itertools.pairwise(widgets):
        assert left.geometry().right() < right.x(), (left, right)
    assert widgets[0].x() >= 0 and widgets[-1].geometry().right() <= bar.width()
    for label in (w for w in widgets if isinstance(w, QLabel)):
        assert _fits(label), label.text()

    room = bar.message_rect()
    assert room.right() < widgets[0].x()
    assert bar.shown_message and bar.shown_message != STEP  # cut, not clipped mid-letter
    assert bar.shown_message.endswith("…")
    assert bar.fontMetrics().horizontalAdvance(bar.shown_message) <= room.width()
    assert bar.currentMessage() == STEP and bar.toolTip() == STEP

    gauge = win.context_bar
    assert gauge.isVisible() and "left out" in gauge.text()
    assert gauge.fontMetrics().horizontalAdvance(gauge.text()) < gauge.contentsRect().width()

    resume = win.downloads_status.button
    assert resume.isVisible() and resume.text() == "Resume 1 unfinished download…"

    conversations = win.sidebar.list
    assert not conversations.horizontalScrollBar().isVisible()
    item = conversations.item(0)
    assert item.text() == LONG_TITLE
    assert conversations.visualItemRect(item).width() <= conversations.viewport().width()
    assert LONG_TITLE in item.toolTip()
