"""The window's side of the hub: search, repository details, remote headers and downloads,
run off the GUI thread, with their results as signals.

`HubJobs` runs one blocking call of engine.models.hub per request on a small thread pool; each
request has an id and a cancel event, and a newer search cancels the older one, so a result
that comes back late is recognised (by its id) and dropped. `Downloads` wraps
engine.models.queue.DownloadQueue for the whole session: the window owns it, so downloads go on
while the user chats and after the model picker is closed; it also finds the parts an earlier
run left unfinished, to offer resuming them.

Every signal is emitted from a worker thread on a QObject that lives on the GUI thread, so Qt
queues it to the GUI thread's slots; receivers must be QObject slots (bound methods).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from engine.models.download import Downloader
from engine.models.download_parts import (
    PartialDownload,
    RemoteFile,
    discard_partial,
    list_partial,
)
from engine.models.download_transfer import Progress
from engine.models.hub import HubClient, RepoDetails, SortOrder
from engine.models.quants import QuantGroup, parse_gguf_name
from engine.models.queue import Cancels, DownloadQueue, JobEvent, JobState
from engine.models.remote import Hub, HubCancelledError, HubError, default_endpoint

log = logging.getLogger(__name__)


def default_hub() -> Hub:
    """The hub with the token from Settings (or $HF_TOKEN), read at each request so that a
    token saved a moment ago is used at once."""
    from engine.models.credentials import load_token

    return Hub(endpoint=default_endpoint(), token=load_token())


class Call(StrEnum):
    SEARCH = "search"
    DETAILS = "details"
    HEADER = "header"


@dataclass(frozen=True)
class HubResult:
    """One request's answer: `value` on success, else `error` (a message to show as it is)."""

    request: int
    call: Call
    value: Any = None
    error: str | None = None
    offline: bool = False  # the hub could not be reached: the window says so on one line
    key: Any = None  # what the request was about (a repository, a quantization group)


class HubJobs(QObject):
    """Blocking hub calls on worker threads; every answer is one `finished(HubResult)`.
    Cancelled requests answer nothing."""

    finished = Signal(object)

    def __init__(self, hub: Callable[[], Hub] = default_hub, parent: QObject | None = None,
                 workers: int = 3) -> None:
        super().__init__(parent)
        self._hub = hub
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hub")
        self._next = 0
        self._cancels = Cancels()
        self._search: int | None = None

    def hub(self) -> Hub:
        """The hub as a request would see it now (its address and token)."""
        return self._hub()

    def search(self, text: str, sort: SortOrder = SortOrder.DOWNLOADS) -> int:
        """Search GGUF repositories; an earlier search still running is cancelled."""
        if self._search is not None:
            self.cancel(self._search)
        self._search = self._submit(Call.SEARCH, text,
                                    lambda c, cancel: c.search(text, sort=sort, cancel=cancel))
        return self._search

    def details(self, repo: str) -> int:
        return self._submit(Call.DETAILS, repo,
                            lambda c, cancel: c.details(repo, cancel=cancel))

    def header(self, details: RepoDetails, group: QuantGroup) -> int:
        return self._submit(Call.HEADER, (details.repo, group.quant),
                            lambda c, cancel: c.header(details, group, cancel))

    def cancel(self, request: int) -> None:
        self._cancels.cancel(request)

    def close(self) -> None:
        """Cancel everything and wait for the workers (each stops at its next check)."""
        self._cancels.cancel_all()
        self._pool.shutdown(wait=True)

    def _submit(self, call: Call, key: Any,
                action: Callable[[HubClient, threading.Event], Any]) -> int:
        self._next += 1
        request = self._next
        cancel = self._cancels.new(request)
        self._pool.submit(self._run, request, call, key, action, cancel)
        return request

    def _run(self, request: int, call: Call, key: Any,
             action: Callable[[HubClient, threading.Event], Any],
             cancel: threading.Event) -> None:
        result: HubResult | None
        try:
            value = action(HubClient(self._hub()), cancel)
            result = HubResult(request, call, value, key=key)
        except HubCancelledError:
            result = None
        except HubError as exc:
            from engine.models.remote import HubOfflineError

            result = HubResult(request, call, error=str(exc),
                               offline=isinstance(exc, HubOfflineError), key=key)
        except Exception as exc:  # a bug: shown, and the log has the trace
            log.exception("hub %s failed", call.value)
            result = HubResult(request, call, error=f"unexpected error ({type(exc).__name__}: "
                               f"{exc})", key=key)
        cancelled = self._cancels.done(request)
        if result is not None and not cancelled:
            self.finished.emit(result)


class RowState(StrEnum):
    """A download as the window lists it: the queue's states, and a part left by an earlier
    run that waits for Resume."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNFINISHED = "unfinished"  # found at start

    @property
    def resumable(self) -> bool:
        return self in (RowState.FAILED, RowState.CANCELLED, RowState.UNFINISHED)


@dataclass(frozen=True)
class DownloadRow:
    """One model being downloaded (all of a split model's parts), as the window shows it."""

    row: int  # stable for the session, whatever job runs it now
    title: str
    remotes: tuple[RemoteFile, ...]
    state: RowState
    job: int | None = None
    progress: Progress | None = None
    part: int = 0
    done_bytes: int = 0  # of every part together
    error: str | None = None
    files: tuple[Path, ...] = field(default=())  # when done: the first is the one to load

    @property
    def total_bytes(self) -> int | None:
        sizes = [r.size for r in self.remotes]
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)


class Downloads(QObject):
    """The session's downloads (see the module's docstring). `changed(DownloadRow)` after
    every event; `model_downloaded(Path)` when a model is complete, with the file to load."""

    changed = Signal(object)
    model_downloaded = Signal(object)
    _event = Signal(object)  # from the queue's threads

    def __init__(self, models_dir: Path, hub: Callable[[], Hub] = default_hub,
                 parent: QObject | None = None, parallel: int = 2) -> None:
        super().__init__(parent)
        self.models_dir = models_dir
        self._hub = hub
        self._parallel = parallel
        self._queue: DownloadQueue | None = None
        self._downloader: Downloader | None = None
        self.rows: dict[int, DownloadRow] = {}
        self._by_job: dict[int, int] = {}
        self._event.connect(self._on_event)

    def add(self, title: str, remotes: list[RemoteFile]) -> DownloadRow:
        """Queue a model's files (every part of a split model) under `title`."""
        for row in self.rows.values():  # the same model again: resume its row
            if row.remotes == tuple(remotes):
                if row.state in (RowState.QUEUED, RowState.RUNNING, RowState.DONE):
                    return row
                return self.resume(row.row)
        row = DownloadRow(len(self.rows) + 1, title, tuple(remotes), RowState.QUEUED)
        self.rows[row.row] = row
        return self._start(row)

    def cancel(self, row: int) -> None:
        """Stop it; its parts stay for Resume."""
        job = self.rows[row].job
        if job is not None and self._queue is not None:
            self._queue.cancel(job)

    def resume(self, row: int) -> DownloadRow:
        """Start a cancelled, failed or unfinished download again from its parts."""
        return self._start(self.rows[row])

    def discard(self, row: int) -> None:
        """Forget an unfinished download and delete its parts."""
        found = self.rows.pop(row)
        parts = {p.target.name: p for p in list_partial(self.models_dir)}
        for remote in found.remotes:
            if remote.name in parts:
                discard_partial(parts[remote.name])
        self.changed.emit(found)  # listeners see it gone from `rows`

    def find_unfinished(self) -> list[DownloadRow]:
        """The parts an earlier run left (a Cancel, a crash, a full disk), as rows waiting
        for Resume; call once at start."""
        known = {r.name for row in self.rows.values() for r in row.remotes}
        found: list[DownloadRow] = []
        for partial in list_partial(self.models_dir):
            if partial.remote.name in known:
                continue
            row = DownloadRow(len(self.rows) + 1, _title(partial), (partial.remote,),
                              RowState.UNFINISHED, done_bytes=partial.done)
            self.rows[row.row] = row
            found.append(row)
            self.changed.emit(row)
        return found

    @property
    def active(self) -> list[DownloadRow]:
        return [r for r in self.rows.values() if r.state in (RowState.QUEUED, RowState.RUNNING)]

    def close(self) -> None:
        """Stop every download (their parts are kept) and wait for the workers."""
        if self._queue is not None:
            self._queue.close()
            self._queue = None

    def _start(self, row: DownloadRow) -> DownloadRow:
        if self._queue is None or self._downloader is None:
            self._downloader = Downloader(self.models_dir, self._hub())
            self._queue = DownloadQueue(self._downloader, self._event.emit, self._parallel)
        else:
            self._downloader.hub = self._hub()  # a token saved since the last download
        updated = replace(row, state=RowState.QUEUED, error=None, progress=None)
        self.rows[row.row] = updated
        job = self._queue.add(row.title, list(row.remotes))
        self._by_job[job] = row.row
        self.rows[row.row] = replace(self.rows[row.row], job=job)
        self.changed.emit(self.rows[row.row])  # listed at once, before the queue's first event
        return self.rows[row.row]

    @Slot(object)
    def _on_event(self, event: JobEvent) -> None:
        number = self._by_job.get(event.job)
        if number is None or number not in self.rows:
            return
        row = self.rows[number]
        if row.job is not None and row.job != event.job:
            return  # an older job of this row (cancelled, then resumed)
        before = sum(r.size or 0 for r in row.remotes[: event.part])
        done = before + event.progress.done if event.progress is not None else row.done_bytes
        row = replace(row, state=RowState(event.state.value), progress=event.progress,
                      part=event.part, done_bytes=done, error=event.error,
                      files=tuple(f.path for f in event.files))
        if event.state is JobState.DONE:
            row = replace(row, done_bytes=sum(f.size for f in event.files), progress=None)
        self.rows[number] = row
        self.changed.emit(row)
        if event.state is JobState.DONE and row.files:
            first = _model_file(row.files[0])
            if first is not None:
                self.model_downloaded.emit(first)


def _model_file(path: Path) -> Path | None:
    """The file llama.cpp loads for a downloaded file: itself, or a split model's first part
    (a part resumed on its own finishes the model only when the first part is there)."""
    name = parse_gguf_name(path.name)
    if name is None or name.part == 1:
        return path
    first = path.with_name(path.name.replace(f"-{name.part:05d}-of-", "-00001-of-"))
    return first if first.is_file() else None


def _title(partial: PartialDownload) -> str:
    return f"{partial.remote.repo} · {partial.remote.name}"
