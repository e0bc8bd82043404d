"""Stop and pre-emption: what a front end does to a request while it runs.

They never queue behind a running request: the engine checks its `Control` between chunks,
inside a chunk (llama.cpp's abort callback) and between tokens. An engine in its own process
keeps a `ThreadControl` that its reader thread sets; an engine on a thread shares one with its
client. This module loads no native library.
"""

from __future__ import annotations

import threading
from typing import Protocol


class Control(Protocol):
    """What the front end can do to a request while it runs (thread- or process-safe)."""

    def stop(self, request_id: int | None = None) -> None:
        """Stop the reply of `request_id` (running or queued), or (None) whatever runs."""
    def stop_requested(self, request_id: int | None = None) -> bool: ...
    def clear_stop(self) -> None:
        """A new reply is queued: a stop for no reply in particular, sent before it, was for
        an earlier one. Called in the order of the messages (never when the reply starts,
        which may be later than a stop sent for it)."""
    def finished(self, request_id: int) -> None:
        """The reply of `request_id` ended: a stop kept for it is no longer needed."""
    def preempt(self) -> int:
        """A real request follows: warm-ups in flight or queued become stale. Returns the
        new epoch."""
    def epoch(self) -> int: ...


class ThreadControl:
    """A `Control` for an engine on another thread of the same process."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        # Replies stopped by id: kept until the reply ends (a stop may come before its reply
        # has started), never cleared by another reply queued after the stop.
        self._stopped: set[int] = set()
        self._epoch = 0
        self._lock = threading.Lock()

    def stop(self, request_id: int | None = None) -> None:
        if request_id is None:
            self._stop.set()
        else:
            with self._lock:
                self._stopped.add(request_id)

    def stop_requested(self, request_id: int | None = None) -> bool:
        return self._stop.is_set() or (request_id is not None and request_id in self._stopped)

    def clear_stop(self) -> None:
        self._stop.clear()

    def finished(self, request_id: int) -> None:
        with self._lock:
            self._stopped.discard(request_id)

    def preempt(self) -> int:
        with self._lock:
            self._epoch += 1
            return self._epoch

    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """The front end's count, when it counts (an engine in its own process)."""
        with self._lock:
            self._epoch = max(self._epoch, epoch)
