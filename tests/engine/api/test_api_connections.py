"""Connections that hold the API without using it: idle ones, ones that send a byte now and
then, requests whose head or body never ends. A normal client is served throughout, and the
hogs are closed (by the connection limit or their deadline), without a log line each."""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from engine.api.guard import ConnectionLimits
from engine.api.server import Server
from tests.engine.api.test_api_server import TIMEOUT, ask, chat, serving

# `serving` runs the API on its own engine process.
pytestmark = pytest.mark.engine_process

HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\n")
DRIP_EVERY_S = 0.1  # well under the deadlines the tests set: each connection stays "active"


@dataclass
class Hog:
    sock: socket.socket
    drip: bool  # sends a byte every DRIP_EVERY_S until the server closes it
    got: bytes = b""
    closed: bool = False  # EOF or reset seen


@dataclass
class Crowd:
    """Raw connections to `server`, and a thread that drips bytes into the dripping ones."""

    server: Server
    hogs: list[Hog] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def open(self, count: int, first: bytes = b"", *, drip: bool = False) -> list[Hog]:
        made = []
        for _ in range(count):
            sock = socket.create_connection((self.server.host, self.server.port))
            if first:
                sock.sendall(first)
            made.append(Hog(sock, drip))
        self.hogs += made
        return made

    @contextmanager
    def dripping(self) -> Iterator[None]:
        thread = threading.Thread(target=self._drip, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join()
            for hog in self.hogs:
                hog.sock.close()

    def _drip(self) -> None:
        dripping = [h for h in self.hogs if h.drip]
        while dripping and not self._stop.wait(DRIP_EVERY_S):
            for hog in list(dripping):
                try:
                    hog.sock.send(b"a")
                except OSError:  # closed by the server
                    dripping.remove(hog)

    def wait_closed(self, hogs: list[Hog], at_least: int) -> None:
        """Read the hogs until `at_least` of them were closed by the server."""
        selector = selectors.DefaultSelector()
        for hog in hogs:
            if not hog.closed:
                selector.register(hog.sock, selectors.EVENT_READ, hog)
        guard = time.monotonic() + TIMEOUT  # a hang guard, not a speed claim
        while sum(h.closed for h in hogs) < at_least:
            assert time.monotonic() < guard, f"{sum(h.closed for h in hogs)} closed"
            for key, _ in selector.select(1.0):
                hog = key.data
                try:
                    data = hog.sock.recv(65536)
                except ConnectionResetError:  # bytes dripped after the close
                    data = b""
                hog.got += data
                if not data:
                    hog.closed = True
                    selector.unregister(hog.sock)
        selector.close()


def served(server: Server) -> None:
    """A normal client's requests, the model's included, are answered."""
    assert httpx.get(server.url + "/models", timeout=TIMEOUT).status_code == 200
    with httpx.Client(timeout=TIMEOUT) as client:
        answer = client.post(server.url + "/chat/completions", json={
            "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 4})
        assert answer.status_code == 200, answer.text[:200]


def guard_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The guard's lines, and any error (a request closed under the app included)."""
    return [r.getMessage() for r in caplog.records
            if r.name == "engine.api.guard" or r.levelno >= logging.ERROR]


def test_eleven_hundred_idle_and_trickling_connections_do_not_lock_a_client_out(
    tiny_models: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """1,100 connections that sent nothing or a byte a second locked every client out: no
    connection limit, no deadline for a request's head. Past the limit, the oldest that have
    not sent a whole request are closed, and a request being answered is not."""
    caplog.set_level(logging.WARNING)
    cap = 100
    with serving(tiny_models["dense"], tmp_path / "a.db",
                 limits=ConnectionLimits(max_connections=cap)) as (server, client):
        crowd = Crowd(server)
        idle = crowd.open(550)
        trickling = crowd.open(550, HEAD + b"x-slow: ", drip=True)
        with crowd.dripping():
            served(server)
            assert ask(client, chat("And you?")).choices
            crowd.wait_closed(crowd.hogs, at_least=len(crowd.hogs) - cap)
            # The idle ones just closed; one that had begun a request heard why.
            assert all(h.got == b"" for h in idle if h.closed)
            assert all(h.got.startswith(b"HTTP/1.1 503") or h.got == b""
                       for h in trickling if h.closed)
            assert any(b"too_many_connections" in h.got for h in trickling)
            served(server)
    assert len(guard_lines(caplog)) == 1, guard_lines(caplog)


def test_heads_and_bodies_that_never_end_are_answered_408_and_closed(
    tiny_models: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A deadline runs from the start of a request's head and of its body: a byte now and
    then does not extend it, and nothing sent at all ends the connection silently."""
    caplog.set_level(logging.WARNING)
    limits = ConnectionLimits(header_timeout_s=0.5, body_timeout_s=0.5)
    with serving(tiny_models["dense"], tmp_path / "a.db", limits=limits) as (server, _client):
        crowd = Crowd(server)
        body_head = HEAD + b"content-length: 100000\r\n\r\n{"
        idle = crowd.open(60)
        stalled_heads = crowd.open(20, HEAD)
        stalled_bodies = crowd.open(20, body_head)
        crowd.open(60, HEAD + b"x-slow: ", drip=True)
        crowd.open(60, body_head, drip=True)
        with crowd.dripping():
            served(server)
            crowd.wait_closed(crowd.hogs, at_least=len(crowd.hogs))
            assert all(h.got == b"" for h in idle)
            for hogs, part in ((stalled_heads, b"head"), (stalled_bodies, b"body")):
                for hog in hogs:
                    assert hog.got.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), hog.got
                    assert b'"message": "the request ' + part + b" did not arrive" in hog.got
            served(server)
    assert guard_lines(caplog) == []
