"""Discover in the model picker, against a local stand-in for the hub
(tests/engine/models/fake_hub.py) with the real huggingface_hub client and the real
downloader: search and pick with the fit of each quantization, offline, a download with its
progress that ends in the picker ready to load, Cancel then Resume, the parts of an earlier run
offered at start, a gated model's 401 and the token that opens it. Every wait is on a signal
(pytest-qt's timeouts are hang guards only) or on the fake hub's events."""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import keyring
import keyring.backends.fail
import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.dialogs.discover import (
    RECOMMENDED_NOTE,
    DiscoverPanel,
    DownloadsView,
    checkpoint_budget,
    gib,
    no_gpu,
)
from app.dialogs.hub_token import TokenBox
from app.dialogs.model_picker import Column, ModelPicker
from app.state.hub_jobs import Call, Downloads, HubJobs, HubResult, RowState, default_hub
from app.window.main_window import MainWindow
from engine.config.settings import Settings
from engine.files.paths import data_dirs
from engine.models.credentials import load_token
from engine.models.download import Downloader
from engine.models.download_parts import list_partial
from engine.models.download_transfer import Progress
from engine.models.fit import GpuMemory, MemoryNeed
from engine.models.hub import HubClient, fit_of
from engine.models.recommended import load_recommended
from engine.models.remote import Hub, HubCancelledError
from tests.app_fixtures import TIMEOUT
from tests.engine.models.fake_hub import TOKEN, FakeHub, FakeHubServer
from tests.fake_engine import Script

WAIT = 60_000  # a hang guard
REPO = "arbor-test/tiny-GGUF"
NAME = "tiny-dense-F32.gguf"
PLENTY = 1 << 40  # free RAM for "fits"
SETTINGS = Settings(n_ctx=4096)


@pytest.fixture
def model_bytes(tiny_models: dict[str, Path]) -> bytes:
    return tiny_models["dense"].read_bytes()


@pytest.fixture
def fake_hub(model_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    half = len(model_bytes) // 2
    monkeypatch.delenv("HF_TOKEN", raising=False)
    previous = keyring.get_keyring()
    keyring.set_keyring(keyring.backends.fail.Keyring())  # the token goes to the 0600 file
    with FakeHubServer() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)  # what default_hub() reads
        hub.add_repo(REPO, {
            NAME: model_bytes,
            "tiny-dense-Q8_0-00001-of-00002.gguf": model_bytes[:half],
            "tiny-dense-Q8_0-00002-of-00002.gguf": model_bytes[half:],
        }, downloads=500)
        hub.add_repo("arbor-test/gated-GGUF", {"gated-F32.gguf": model_bytes}, gated=True,
                     downloads=10)
        yield hub
    keyring.set_keyring(previous)


@pytest.fixture
def hub_parts(qtbot: QtBot) -> Iterator[tuple[HubJobs, Downloads]]:
    jobs = HubJobs(default_hub)
    downloads = Downloads(data_dirs().models, default_hub)
    yield jobs, downloads
    jobs.close()
    downloads.close()


def panel(qtbot: QtBot, jobs: HubJobs, downloads: Downloads, free_ram: int = PLENTY,
          free_vram: Callable[[], int | None] = no_gpu,
          settings: Settings = SETTINGS) -> DiscoverPanel:
    made = DiscoverPanel(jobs, downloads, settings, free_ram=lambda: free_ram,
                         free_vram=free_vram)
    qtbot.addWidget(made)
    return made


def answer(call: Call) -> object:
    return lambda result: isinstance(result, HubResult) and result.call is call


def open_repo(qtbot: QtBot, view: DiscoverPanel, repo: str, quant: str | None) -> None:
    """Open a repository and wait for its files and the selected model's header."""
    with qtbot.waitSignals([view.jobs.finished, view.jobs.finished], timeout=WAIT,
                           check_params_cbs=[answer(Call.DETAILS), answer(Call.HEADER)]):
        view.open_repo(repo, quant)


def test_search_lists_gguf_repos_and_a_pick_shows_each_quant_with_its_fit(
        qtbot: QtBot, fake_hub: FakeHub, hub_parts: tuple[HubJobs, Downloads],
        model_bytes: bytes) -> None:
    jobs, downloads = hub_parts
    view = panel(qtbot, jobs, downloads)
    assert view.notice.text() == RECOMMENDED_NOTE  # empty box: the list, no request
    assert view.results.count() == len(load_recommended())
    assert fake_hub.requests == []

    view.search_box.setText("tiny")
    with qtbot.waitSignal(jobs.finished, timeout=WAIT, check_params_cb=answer(Call.SEARCH)):
        view.run_search()
    assert [view.results.item(i).text().split("\n")[0]
            for i in range(view.results.count())] == [REPO]
    searched = [r for r in fake_hub.requests if r.path == "/api/models"]
    assert searched[-1].query["filter"] == ["gguf"] and searched[-1].query["search"] == ["tiny"]

    with qtbot.waitSignals([jobs.finished, jobs.finished], timeout=WAIT,
                           check_params_cbs=[answer(Call.DETAILS), answer(Call.HEADER)]):
        view.results.setCurrentRow(0)
    rows = {view.table.item(r, 0).text(): r for r in range(view.table.rowCount())}
    assert set(rows) == {"F32", "Q8_0 (2 parts)"}
    assert "apache-2.0" in view.repo_label.text()
    for row in rows.values():
        assert view.fit_label(row) == "fits"
        assert view.table.item(row, 3).text() == "llama"  # from the header, over ranges
        assert view.table.item(row, 5).text() == "dense"
        assert view.table.item(row, 1).text().endswith("MiB")
    # Only ranges of the file were read, never the weights.
    cdn = fake_hub.cdn_requests()
    assert cdn and all(r.range is not None for r in cdn)
    assert sum(int(r.range.split("-")[1]) - int(r.range.split("=")[1].split("-")[0]) + 1
               for r in cdn if r.range) < len(model_bytes)

    tight = panel(qtbot, jobs, downloads, free_ram=1 << 20)
    open_repo(qtbot, tight, REPO, "F32")
    assert tight.fit_label(0) == "does not fit"


def report_gpu(qtbot: QtBot, win: MainWindow, script: Script, usable: int) -> None:
    """The fake engine loads the model again and reports a GPU on which a model may take
    `usable` bytes: 1 GiB more free, less the margin llama.cpp keeps."""
    script.gpu = GpuMemory(free=usable + (1 << 30), total=usable + (4 << 30), margin=1 << 30)
    model = win.replies.model_path
    assert model is not None
    with qtbot.waitSignal(win.model_ready, timeout=TIMEOUT):
        win.models.load_model(model)


def test_with_a_gpu_reported_by_the_engine_the_fit_puts_layers_on_it_first(
        qtbot: QtBot, fake_hub: FakeHub, hub_parts: tuple[HubJobs, Downloads],
        fake_window: MainWindow, fake_engine: Script) -> None:
    """The window's process never loads llama.cpp: the GPU's memory comes from the engine (the
    fake one here, over the real protocol), and Discover's verdict follows it."""
    jobs, downloads = hub_parts
    win = fake_window
    assert win.replies.free_vram() is None  # the fake engine's machine has no GPU yet
    sizing = panel(qtbot, jobs, downloads)
    open_repo(qtbot, sizing, REPO, "F32")
    shown, group = sizing.shown, sizing.selected_group()
    assert shown is not None and shown.header is not None
    assert group is not None and group.size is not None
    need: MemoryNeed = fit_of(shown.header, group.size, SETTINGS.n_ctx, free_ram=PLENTY,
                              checkpoint_budget=checkpoint_budget(SETTINGS)).need
    row = shown.details.groups.index(group)

    def verdict(free_ram: int, settings: Settings = SETTINGS) -> tuple[str, str]:
        view = panel(qtbot, jobs, downloads, free_ram, win.replies.free_vram, settings)
        open_repo(qtbot, view, REPO, "F32")
        cell = view.table.item(row, 2)
        return cell.text(), cell.toolTip()

    # RAM for the checkpoints and half the weights: no context fits in RAM alone...
    ram = need.checkpoints + need.weights // 2
    assert verdict(ram)[0] == "does not fit"
    # ...all of it fits a GPU with that much room, the checkpoints staying in RAM...
    report_gpu(qtbot, win, fake_engine, need.on_device)
    assert win.replies.free_vram() == need.on_device
    label, tip = verdict(ram)
    assert label == "fits on the GPU"
    assert f"The GPU can take {gib(need.on_device)}" in tip and "0 MiB would spill" in tip
    # ...part of it with half that room (the rest in RAM)...
    report_gpu(qtbot, win, fake_engine, need.on_device // 2)
    label, tip = verdict(need.checkpoints + need.on_device)
    assert label == "fits on the GPU and in RAM"
    spill = need.on_device - need.on_device // 2
    assert f"{gib(spill)} would spill to RAM" in tip
    # ...and a model that needs more than the GPU and RAM together does not fit.
    report_gpu(qtbot, win, fake_engine, need.weights // 4)
    assert verdict(need.checkpoints + need.weights // 4)[0] == "does not fit"
    # With GPU layers at 0 in Settings the GPU takes nothing: RAM alone decides.
    report_gpu(qtbot, win, fake_engine, need.on_device)
    label, tip = verdict(ram, replace(SETTINGS, n_gpu_layers=0))
    assert label == "does not fit" and "the GPU is not counted" in tip
    # The window's own picker gives Discover the engine's figure.
    picker = win.models.picker(discover=True)
    qtbot.addWidget(picker)
    assert picker.discover is not None and picker.tabs.currentWidget() is picker.discover
    open_repo(qtbot, picker.discover, REPO, "F32")
    assert picker.discover.fit_label(row).startswith("fits on the GPU")
    assert f"The GPU can take {gib(need.on_device)}" in picker.discover.table.item(
        row, 2).toolTip()


def test_offline_search_says_so_on_one_line_and_keeps_the_recommended_list(
        qtbot: QtBot, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    jobs = HubJobs(lambda: Hub(closed))
    downloads = Downloads(data_dirs().models, lambda: Hub(closed))
    try:
        view = panel(qtbot, jobs, downloads)
        view.search_box.setText("qwen")
        with qtbot.waitSignal(jobs.finished, timeout=WAIT, check_params_cb=answer(Call.SEARCH)):
            view.run_search()
        assert view.notice.text().startswith("Offline: cannot reach")
        assert "\n" not in view.notice.text()
        assert view.results.count() == len(load_recommended())  # still usable offline
    finally:
        jobs.close()
        downloads.close()


def test_a_download_shows_progress_and_its_model_appears_in_the_picker_ready_to_load(
        qtbot: QtBot, fake_hub: FakeHub, hub_parts: tuple[HubJobs, Downloads],
        model_bytes: bytes) -> None:
    jobs, downloads = hub_parts
    picker = ModelPicker(None, paths=[], settings=SETTINGS, builtin=[], jobs=jobs,
                         downloads=downloads)
    qtbot.addWidget(picker)
    assert picker.discover is not None and picker.model.rowCount() == 0
    open_repo(qtbot, picker.discover, REPO, "F32")
    fake_hub.hold_at = len(model_bytes) // 2
    row = picker.discover.download_selected()
    assert row is not None
    fake_hub.held.wait()  # half the file sent: the line shows where it is
    line = picker.discover.downloads_view.lines[row.row]
    qtbot.waitUntil(lambda: downloads.rows[row.row].progress is not None, timeout=WAIT)
    assert " of " in line.bar.format() and "MiB" in line.bar.format()
    assert line.cancel_button.isVisibleTo(line) and not line.resume_button.isVisibleTo(line)
    with qtbot.waitSignal(downloads.model_downloaded, timeout=WAIT) as done:
        fake_hub.release.set()
    path = data_dirs().models / NAME
    assert done.args == [path] and path.read_bytes() == model_bytes
    assert line.bar.format().startswith("done")
    assert picker.tabs.currentIndex() == 0  # back on the local list, the model selected
    assert picker.chosen() == path and picker.load_button.isEnabled()
    name = picker.model.index(0, Column.NAME).data()
    assert name == "Tiny Dense · F32"


def test_cancel_keeps_the_part_and_resume_fetches_only_the_rest(
        qtbot: QtBot, fake_hub: FakeHub, hub_parts: tuple[HubJobs, Downloads],
        model_bytes: bytes) -> None:
    jobs, downloads = hub_parts
    view = panel(qtbot, jobs, downloads)
    open_repo(qtbot, view, REPO, "F32")
    hold = len(model_bytes) // 3
    fake_hub.hold_at = hold
    row = view.download_selected()
    assert row is not None
    fake_hub.held.wait()
    line = view.downloads_view.lines[row.row]
    with qtbot.waitSignal(downloads.changed, timeout=WAIT,
                          check_params_cb=lambda r: r.state is RowState.CANCELLED):
        qtbot.mouseClick(line.cancel_button, Qt.MouseButton.LeftButton)
        fake_hub.hold_at = None
        fake_hub.release.set()
    [partial] = list_partial(data_dirs().models)
    assert 0 < partial.done < len(model_bytes)
    assert line.resume_button.isVisibleTo(line) and "cancelled" in line.bar.format()
    with qtbot.waitSignal(downloads.model_downloaded, timeout=WAIT):
        qtbot.mouseClick(line.resume_button, Qt.MouseButton.LeftButton)
    assert (data_dirs().models / NAME).read_bytes() == model_bytes
    assert fake_hub.cdn_requests()[-1].range == f"bytes={partial.done}-"


def test_parts_left_by_an_earlier_run_are_offered_and_resumed(
        qtbot: QtBot, fake_hub: FakeHub, model_bytes: bytes) -> None:
    client = HubClient(Hub(fake_hub.url))
    details = client.details(REPO)
    [remote] = client.remote_files(details, details.group("F32"))
    cancel = threading.Event()

    def stop(p: Progress) -> None:
        if p.done >= 1 << 20:
            cancel.set()

    with pytest.raises(HubCancelledError):  # as a run that ended mid-file leaves it
        Downloader(data_dirs().models, client.hub).download(remote, progress=stop,
                                                            cancel=cancel)
    downloads = Downloads(data_dirs().models, default_hub)
    try:
        [offered] = downloads.find_unfinished()
        view = DownloadsView(downloads)
        qtbot.addWidget(view)
        line = view.lines[offered.row]
        assert line.bar.format().startswith("unfinished from last time")
        assert line.resume_button.isVisibleTo(line) and line.discard_button.isVisibleTo(line)
        with qtbot.waitSignal(downloads.model_downloaded, timeout=WAIT):
            qtbot.mouseClick(line.resume_button, Qt.MouseButton.LeftButton)
        assert (data_dirs().models / NAME).read_bytes() == model_bytes
        assert fake_hub.cdn_requests()[-1].range == f"bytes={offered.done_bytes}-"
        assert hashlib.sha256(model_bytes).hexdigest() == remote.sha256
    finally:
        downloads.close()


def test_a_gated_model_says_what_to_do_and_the_saved_token_opens_it_unseen(
        qtbot: QtBot, fake_hub: FakeHub, hub_parts: tuple[HubJobs, Downloads],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    jobs, downloads = hub_parts
    view = panel(qtbot, jobs, downloads)
    open_repo(qtbot, view, "arbor-test/gated-GGUF", None)
    assert "gated" in view.repo_label.text()
    assert "needs an access token" in view.notice.text()
    assert "Settings" in view.notice.text()
    assert view.fit_label(0) == "unknown (header not read)"

    box = TokenBox()
    qtbot.addWidget(box)
    assert not box.had_token and box.field.text() == ""
    box.field.setText(TOKEN)
    assert box.field.echoMode() is box.field.EchoMode.Password
    assert "saved" in (box.save() or "")
    assert load_token() == TOKEN
    again = TokenBox()  # the next Settings dialog
    qtbot.addWidget(again)
    assert again.had_token and again.field.text() == ""
    assert TOKEN not in again.field.placeholderText()

    open_repo(qtbot, view, "arbor-test/gated-GGUF", None)
    assert view.fit_label(0) == "fits"
    assert any(r.authorization == f"Bearer {TOKEN}" for r in fake_hub.requests)
    assert TOKEN not in caplog.text


def test_a_split_model_downloads_every_part_and_offers_its_first_to_load(
        qtbot: QtBot, fake_hub: FakeHub, hub_parts: tuple[HubJobs, Downloads],
        model_bytes: bytes) -> None:
    jobs, downloads = hub_parts
    view = panel(qtbot, jobs, downloads)
    open_repo(qtbot, view, REPO, "Q8_0")
    assert view.download_button.text().startswith("Download Q8_0")
    with qtbot.waitSignal(downloads.model_downloaded, timeout=WAIT) as done:
        row = view.download_selected()
    assert row is not None and len(row.remotes) == 2
    first, second = (data_dirs().models / f"tiny-dense-Q8_0-0000{i}-of-00002.gguf"
                     for i in (1, 2))
    assert done.args == [first]
    assert first.read_bytes() + second.read_bytes() == model_bytes


def test_a_resumed_second_part_offers_the_split_models_first_part(
        qtbot: QtBot, fake_hub: FakeHub, model_bytes: bytes) -> None:
    client = HubClient(Hub(fake_hub.url))
    details = client.details(REPO)
    one, two = client.remote_files(details, details.group("Q8_0"))
    Downloader(data_dirs().models, client.hub).download(one)
    cancel = threading.Event()

    def stop(p: Progress) -> None:
        if p.done >= 1 << 20:
            cancel.set()

    with pytest.raises(HubCancelledError):
        Downloader(data_dirs().models, client.hub).download(two, progress=stop, cancel=cancel)
    downloads = Downloads(data_dirs().models, default_hub)
    try:
        [offered] = downloads.find_unfinished()
        with qtbot.waitSignal(downloads.model_downloaded, timeout=WAIT) as done:
            downloads.resume(offered.row)
        assert done.args == [data_dirs().models / one.name]
    finally:
        downloads.close()
