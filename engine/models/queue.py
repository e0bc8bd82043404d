"""Several downloads queued, a few at a time, while the user chats.

Qt-free: the window wraps `on_event` in a signal (it is called on the queue's worker threads,
with frozen values only) and calls `add` and `cancel` from the GUI thread. The states follow
the team's worker vocabulary: queued, running, done, failed, cancelled.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum

from engine.models.download import Downloader
from engine.models.download_parts import RemoteFile
from engine.models.download_transfer import Downloaded, Progress
from engine.models.remote import HubCancelledError, HubError

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 0.1  # seconds between progress events of one job


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobEvent:
    job: int
    title: str  # what the window shows, e.g. "ggml-org/gemma-3-1b-it-GGUF:Q4_K_M"
    state: JobState
    progress: Progress | None = None  # while running: the file being fetched
    part: int = 0  # which of the job's files (a split model has several), 0-based
    parts: int = 1
    files: tuple[Downloaded, ...] = ()  # when done: every file, the first is the one to load
    error: str | None = None  # when failed: the message to show as it is


class Cancels:
    """One cancel event per running job, shared by the job's thread and whoever stops it."""

    def __init__(self) -> None:
        self._events: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def new(self, job: int) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._events[job] = event
        return event

    def cancel(self, job: int) -> None:
        with self._lock:
            event = self._events.get(job)
        if event is not None:
            event.set()

    def cancel_all(self) -> None:
        with self._lock:
            for event in self._events.values():
                event.set()

    def done(self, job: int) -> bool:
        """The job ended: forget it; whether it was cancelled."""
        with self._lock:
            event = self._events.pop(job, None)
        return event is not None and event.is_set()


class DownloadQueue:
    """Runs queued downloads `parallel` at a time on worker threads."""

    def __init__(self, downloader: Downloader, on_event: Callable[[JobEvent], None],
                 parallel: int = 2) -> None:
        self._downloader = downloader
        self._on_event = on_event
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="download")
        self._ids = itertools.count(1)
        self._cancels = Cancels()

    def add(self, title: str, remotes: list[RemoteFile]) -> int:
        """Queue a model's files; its job id (events carry it)."""
        job = next(self._ids)
        cancel = self._cancels.new(job)
        self._emit(JobEvent(job, title, JobState.QUEUED, parts=len(remotes)))
        self._pool.submit(self._run, job, title, list(remotes), cancel)
        return job

    def cancel(self, job: int) -> None:
        """Stop a job, queued or running; its parts stay to resume (add it again)."""
        self._cancels.cancel(job)

    def close(self) -> None:
        """Cancel every job and wait for the workers to stop (parts are kept)."""
        self._cancels.cancel_all()
        self._pool.shutdown(wait=True)

    def _run(self, job: int, title: str, remotes: list[RemoteFile],
             cancel: threading.Event) -> None:
        done: list[Downloaded] = []
        try:
            for index, remote in enumerate(remotes):
                if cancel.is_set():
                    raise HubCancelledError("cancelled")
                self._emit(JobEvent(job, title, JobState.RUNNING, part=index,
                                    parts=len(remotes)))
                done.append(self._downloader.download(
                    remote, progress=self._progress(job, title, index, len(remotes)),
                    cancel=cancel))
            final = JobEvent(job, title, JobState.DONE, parts=len(remotes), files=tuple(done))
        except HubCancelledError:
            final = JobEvent(job, title, JobState.CANCELLED, parts=len(remotes))
        except (HubError, OSError) as exc:
            final = JobEvent(job, title, JobState.FAILED, parts=len(remotes), error=str(exc))
        except Exception as exc:  # a bug: the job fails visibly, the log has the trace
            log.exception("download job %d failed", job)
            final = JobEvent(job, title, JobState.FAILED, parts=len(remotes),
                             error=f"unexpected error ({type(exc).__name__}: {exc})")
        self._cancels.done(job)
        self._emit(final)

    def _progress(self, job: int, title: str, index: int, parts: int
                  ) -> Callable[[Progress], None]:
        last = [0.0]

        def report(p: Progress) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL or p.done == p.total:
                last[0] = now
                self._emit(JobEvent(job, title, JobState.RUNNING, progress=p, part=index,
                                    parts=parts))

        return report

    def _emit(self, event: JobEvent) -> None:
        try:
            self._on_event(event)
        except Exception:  # the listener's bug must not stop a download
            log.exception("a download listener failed")
