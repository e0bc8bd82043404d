"""The API's defence against connections that hold the server without using it.

uvicorn alone has no limit on open connections and no deadline for a request's head or body
(`limit_concurrency` counts connections but only answers 503 to a request once one arrives: a
connection that never sends one is kept for ever). A thousand idle or byte-a-second
connections then locked every client out, and once the process ran out of file descriptors
the accept loop logged "out of system resource" hundreds of times a second.

`guarded_protocol` makes uvicorn's h11 protocol with three rules:

- a request's head must arrive within `header_timeout_s` of the connection (or of the previous
  response), however slowly its bytes trickle in; its body within `body_timeout_s` of the head.
  A late one is answered 408 (if it sent anything) and closed;
- at most `max_connections` are open: a connection past the limit closes the oldest one still
  sending its request (or idle between requests); if every other one has a request being
  answered, the newcomer is refused with a 503. A client whose request is being answered is
  never closed for another;
- the limit stays well under the process's file-descriptor limit (raised to its hard limit),
  so `accept` never fails for want of one.

One warning is logged when the limit is first reached, none per connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.api.schema import ApiError

log = logging.getLogger(__name__)

BACKLOG = 128  # connections accepted per wake-up of the accept loop, at most
FD_RESERVE = 256  # descriptors kept for everything else: the store, the engine, Qt
MIN_CONNECTIONS = 16


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 256
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0


class Phase(Enum):
    HEAD = "head"  # waiting for a request's head (a new or a kept-alive connection)
    BODY = "body"  # the head is in, the body is coming
    ANSWER = "answer"  # the request is whole: the app answers it


def fd_limit() -> int | None:
    """Raise the soft limit on open files to the hard one; the soft limit after (None where
    there is no such limit to read)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft != resource.RLIM_INFINITY and soft < wanted:
        for target in (wanted, 10240):  # macOS refuses more than its per-process maximum
            if target <= soft:
                break
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            except (ValueError, OSError):
                continue
            soft = target
            break
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(limits: ConnectionLimits, fds: int | None) -> int:
    """`limits.max_connections`, lowered to leave room under the descriptor limit for a
    burst of accepts and everything else the process has open."""
    if fds is None:
        return limits.max_connections
    return max(MIN_CONNECTIONS, min(limits.max_connections, fds - FD_RESERVE - 2 * BACKLOG))


def error_bytes(error: ApiError, reason: str) -> bytes:
    """A whole HTTP response for `error` that closes the connection, for when no request is
    (or may any more be) answered through the app."""
    body = json.dumps(error.body()).encode()
    return (f"HTTP/1.1 {error.status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class _Guard:
    """The connections of one server, oldest first among those that may be closed."""

    def __init__(self, limits: ConnectionLimits, cap: int) -> None:
        self.limits = limits
        self.cap = cap
        self.live: set[GuardedH11Protocol] = set()
        self.closable: dict[GuardedH11Protocol, None] = {}  # insertion-ordered: oldest first
        self.crowded = False  # the limit was reached, and not yet left well behind
        self.closed = 0  # connections closed or refused for the limit

    def admit(self, newcomer: GuardedH11Protocol) -> None:
        self.live.add(newcomer)
        while len(self.live) > self.cap:
            victim = next(iter(self.closable), newcomer)
            if not self.crowded:
                self.crowded = True
                log.warning("the API has %d connections open, its limit: closing the oldest "
                            "that have not sent a whole request", self.cap)
            self.closed += 1
            busy = ApiError(503, f"the server has {self.cap} connections open; try again",
                            type="server_error", code="too_many_connections")
            victim.drop(busy if victim is newcomer or victim.started() else None,
                        "Service Unavailable")

    def forget(self, connection: GuardedH11Protocol) -> None:
        self.live.discard(connection)
        self.closable.pop(connection, None)
        if self.crowded and len(self.live) <= self.cap * 3 // 4:
            self.crowded = False


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a `_Guard` (see the module's docstring); `guarded_protocol`
    makes one class per server."""

    guard: ClassVar[_Guard]

    _phase: Phase | None = None
    _timer: asyncio.TimerHandle | None = None
    _dropped = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._track()
        self.guard.admit(self)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.guard.forget(self)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """A request h11 cannot parse gets an OpenAI error body too."""
        body = json.dumps(ApiError(400, msg).body()).encode()
        for event in (h11.Response(status_code=400, reason=b"Bad Request", headers=[
                          (b"content-type", b"application/json"),
                          (b"content-length", str(len(body)).encode()),
                          (b"connection", b"close")]),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def _unsupported_upgrade_warning(self) -> None:
        """An Upgrade header is ignored (the request is answered as plain HTTP) without a
        warning per request."""

    def started(self) -> bool:
        """Whether the client sent part of a request that is not answered yet."""
        return self._phase is Phase.BODY or bool(self.conn.trailing_data[0])

    def drop(self, error: ApiError | None, reason: str) -> None:
        """Close the connection, answering `error` first if given. A request the app reads
        sees its client go away."""
        if self._dropped:
            return
        self._dropped = True
        self._cancel_timer()
        self.guard.forget(self)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # nothing the app sends goes out after this
            self.cycle.message_event.set()
        answered = (self._phase is Phase.BODY and self.cycle is not None
                    and self.cycle.response_started)  # a body the app did not wait for
        if not self.transport.is_closing():
            if error is not None and not answered:
                self.transport.write(error_bytes(error, reason))
            self.transport.close()

    def _track(self) -> None:
        """Follow the request's phase; a deadline runs from the start of each phase (not
        from the last byte: a byte a second must not keep a connection)."""
        state = self.conn.their_state
        phase = (Phase.HEAD if state is h11.IDLE else Phase.BODY if state is h11.SEND_BODY
                 else Phase.ANSWER)
        if self._dropped or phase is self._phase:
            return
        self._phase = phase
        self._cancel_timer()
        self.guard.closable.pop(self, None)
        limits = self.guard.limits
        if phase is Phase.HEAD:
            self._timer = self.loop.call_later(limits.header_timeout_s, self._late)
        elif phase is Phase.BODY:
            self._timer = self.loop.call_later(limits.body_timeout_s, self._late)
        else:
            return
        self.guard.closable[self] = None  # the newest

    def _late(self) -> None:
        self._timer = None
        limits = self.guard.limits
        what = (f"the request body did not arrive within {limits.body_timeout_s:g} s"
                if self._phase is Phase.BODY else
                f"the request head did not arrive within {limits.header_timeout_s:g} s")
        self.drop(ApiError(408, what, code="request_timeout") if self.started() else None,
                  "Request Timeout")

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def guarded_protocol(limits: ConnectionLimits, fds: int | None) -> type[GuardedH11Protocol]:
    """A protocol class for one server's connections (`uvicorn.Config(http=...)`)."""

    class Guarded(GuardedH11Protocol):
        guard = _Guard(limits, connection_cap(limits, fds))

    return Guarded
