"""The HTTP side of the local API: Starlette routes, uvicorn, server-sent events.

`GET /v1/models` and `POST /v1/chat/completions` in OpenAI's shapes. Every error is an
OpenAI error body with its status; nothing unhandled reaches a client or the log. The
replies themselves run on `engine.api.worker.ApiWorker`, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import signal
import socket
import stat
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.api.calls import CallDelta
from engine.api.guard import BACKLOG, ConnectionLimits, fd_limit, guarded_protocol
from engine.api.schema import (
    MAX_BODY_BYTES,
    ApiError,
    ChatRequest,
    chunk,
    completion,
    completion_id,
    parse_body,
    parse_chat,
)
from engine.api.worker import Answer, ApiWorker, Delivery, Job, Text

log = logging.getLogger(__name__)

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
JSON = "application/json"
DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    allow_remote: bool = False  # binding anything but loopback needs this and a key
    cors_origins: tuple[str, ...] = ()
    # open connections, deadlines for a request's head and body
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)


API_KEY_ENV = "ARBOR_API_KEY"
MAX_API_KEY_BYTES = 4096


def api_key_of(flag: str | None, file: Path | None, environ: Mapping[str, str]) -> str | None:
    """The API key: from the command line, a file only its owner can read, or ARBOR_API_KEY
    (a command line is readable by every local user). Raises ValueError for a file that is
    not such a file."""
    if flag is not None:
        return flag or None
    if file is not None:
        try:
            info = file.stat()
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"{file} is not a file")
            if os.name == "posix" and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ValueError(f"{file} can be read by other users: chmod 600 it")
            with file.open("rb") as f:
                raw = f.read(MAX_API_KEY_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"cannot read the API key from {file}: "
                             f"{exc.strerror or exc}") from None
        if len(raw) > MAX_API_KEY_BYTES:
            raise ValueError(f"{file} is too long for an API key")
        try:
            key = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ValueError(f"{file} is not UTF-8 text") from None
        if not key or "\n" in key:
            raise ValueError(f"{file} must hold the key on one line")
        return key
    return environ.get(API_KEY_ENV) or None


def check_binding(options: ServerOptions) -> None:
    """Refuse to listen beyond this machine without the explicit flag and a key."""
    if options.host in LOCAL_HOSTS:
        return
    if not options.allow_remote or not options.api_key:
        raise ValueError(f"listening on {options.host} lets other machines use the model: "
                         "it needs --allow-remote and --api-key")


def create_app(worker: ApiWorker, model_id: Callable[[], str], options: ServerOptions
               ) -> Starlette:
    api = _Api(worker, model_id, options)
    middleware = [Middleware(CORSMiddleware, allow_origins=list(options.cors_origins),
                             allow_methods=["GET", "POST"],
                             allow_headers=["authorization", "content-type"])
                  ] if options.cors_origins else []
    return Starlette(
        routes=[Route("/v1/models", api.guarded(api.models), methods=["GET"]),
                Route("/v1/chat/completions", api.guarded(api.chat), methods=["POST"]),
                Route("/arbor/stats", api.guarded(api.stats), methods=["GET"])],
        middleware=middleware,
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )


class _Api:
    def __init__(self, worker: ApiWorker, model_id: Callable[[], str], options: ServerOptions
                 ) -> None:
        self.worker = worker
        self.model_id = model_id
        self._key = options.api_key.encode("utf-8") if options.api_key else None
        self._any_host = options.allow_remote
        # The names of the loopback address it listens on ("localhost" names both).
        self._hosts = {"localhost", options.host} | (
            {"127.0.0.1", "::1"} if options.host == "localhost" else set())
        self._origins = frozenset(options.cors_origins)

    def guarded(self, handler: Callable[[Request], Awaitable[Response]]
                ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                self._admit(request)
                self._authorize(request)
                return await handler(request)
            except ApiError as error:
                return _error(error)
        return run

    def _admit(self, request: Request) -> None:
        """Refuse what a web page in the user's browser can send: a request to a name that
        was rebound to this machine (DNS rebinding), one from a page's origin that was not
        allowed, and a body that is not JSON (a form or text/plain body needs no CORS
        preflight, so the browser would send it from any page)."""
        if not self._any_host:
            host = _host_name(request.headers.get("host", ""))
            if host not in self._hosts:
                raise ApiError(403, f"this server answers requests to the loopback address "
                                    f"only, not to {host[:80]!r}", code="host_not_allowed")
        origin = request.headers.get("origin")
        if origin is not None and origin not in self._origins:
            raise ApiError(403, f"requests from the web page at {origin[:80]!r} are refused "
                                f"(--cors-origin allows an origin)", code="origin_not_allowed")
        if request.method == "POST":
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != JSON:
                raise ApiError(415, f"the body must be JSON, sent as 'Content-Type: {JSON}'",
                               code="unsupported_media_type")

    def _authorize(self, request: Request) -> None:
        if self._key is None:
            return
        # The header's bytes as sent (a key with non-ASCII characters comes as UTF-8; the
        # decoded header is Latin-1).
        given = next((value for name, value in request.scope["headers"]
                      if name == b"authorization"), b"")
        if not hmac.compare_digest(given, b"Bearer " + self._key):
            raise ApiError(401, "a valid API key is needed: 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    async def models(self, _request: Request) -> Response:
        if self.worker.engine.loaded() is None:
            raise ApiError(503, "no model is loaded (the engine is starting again)",
                           type="server_error")
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_id(), "object": "model", "created": 0, "owned_by": "arbor"}]})

    async def stats(self, _request: Request) -> Response:
        """Arbor's own figures: requests answered, prompt tokens decoded while clients
        waited and by warm-ups, and whether a warm-up runs now."""
        return JSONResponse(asdict(self.worker.stats))

    async def chat(self, request: Request) -> Response:
        body = parse_body(await _body(request))
        # Off the event loop: an attached PDF is parsed in a process of its own, for seconds.
        chat = await asyncio.to_thread(parse_chat, body)
        serving = self.model_id()
        if chat.model and chat.model != serving:
            raise ApiError(404, f"the model {chat.model[:80]!r} is not loaded here; this "
                                f"server has {serving!r}", param="model",
                           code="model_not_found")
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[Delivery] = asyncio.Queue()

        def deliver(item: Delivery) -> None:  # on the worker thread
            # A closed loop (RuntimeError): the server has ended, nobody waits.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(inbox.put_nowait, item)

        job = Job(chat, deliver)
        self.worker.submit(job)
        try:
            first = await _next(request, job, inbox)
        except asyncio.CancelledError:
            job.cancelled.set()
            raise
        if first is None:  # the client went away while waiting
            return Response(status_code=499)
        if isinstance(first, ApiError):
            return _error(first)
        ident = completion_id()
        model = chat.model or serving
        if chat.stream:
            return EventSourceResponse(_stream(request, job, inbox, first, chat, ident, model),
                                       ping=15, headers={"Cache-Control": "no-cache"})
        item: Delivery | None = first
        while isinstance(item, Text | CallDelta):  # the text comes whole with the outcome
            item = await _next(request, job, inbox)
        if item is None:
            return Response(status_code=499)
        if isinstance(item, ApiError):
            return _error(item)
        return JSONResponse(completion(ident, model, item.text, item.finish, item.usage,
                                       item.calls, item.logprobs))


async def _stream(request: Request, job: Job, inbox: asyncio.Queue[Delivery],
                  first: Delivery, chat: ChatRequest, ident: str, model: str
                  ) -> AsyncIterator[dict[str, str]]:
    """The chunks of one reply; a client that goes away cancels this, and so the job."""
    def data(body: dict[str, Any]) -> dict[str, str]:
        return {"data": json.dumps(body, ensure_ascii=False)}

    try:
        yield data(chunk(ident, model, delta={"role": "assistant", "content": ""}))
        item: Delivery | None = first
        while item is not None:
            if isinstance(item, ApiError):  # after the stream began: OpenAI's way, in-band
                yield data(item.body())
                break
            if isinstance(item, Answer):
                if item.logprobs is not None:  # all at the end: the text came in pieces
                    yield data(chunk(ident, model, delta={}, logprobs=item.logprobs))
                # Its calls went out as deltas while the model wrote them (engine.api.calls).
                yield data(chunk(ident, model, finish=item.finish))
                if chat.include_usage:
                    yield data(chunk(ident, model, usage=item.usage, choices=False))
                break
            # Whatever has arrived meanwhile goes out together: text as one chunk, a call's
            # arguments as one delta.
            pieces: list[Text | CallDelta] = [item]
            item = None
            while item is None and not inbox.empty():
                queued = inbox.get_nowait()
                if isinstance(queued, Text | CallDelta):
                    pieces.append(queued)
                else:
                    item = queued
            for delta in _merged(pieces):
                yield data(chunk(ident, model, delta=delta))
            if item is None:
                item = await _next(request, job, inbox)
        yield {"data": "[DONE]"}
    finally:
        job.cancelled.set()  # finished, failed or abandoned: nothing more runs for it


def _merged(pieces: list[Text | CallDelta]) -> list[dict[str, Any]]:
    """The deltas of pieces that arrived together: neighbouring text joined, and a call's
    neighbouring arguments (its first delta stays one of its own, as OpenAI sends it)."""
    out: list[dict[str, Any]] = []
    last: Text | CallDelta | None = None
    for piece in pieces:
        if isinstance(piece, Text) and isinstance(last, Text):
            last = Text(last.text + piece.text)
        elif isinstance(piece, CallDelta) and isinstance(last, CallDelta) \
                and piece.id is None and last.id is None and piece.index == last.index:
            last = CallDelta(last.index, last.arguments + piece.arguments)
        else:
            if last is not None:
                out.append(_delta(last))
            last = piece
    if last is not None:
        out.append(_delta(last))
    return out


def _delta(piece: Text | CallDelta) -> dict[str, Any]:
    if isinstance(piece, Text):
        return {"content": piece.text}
    return {"tool_calls": [piece.body()]}


async def _next(request: Request, job: Job, inbox: asyncio.Queue[Delivery]
                ) -> Delivery | None:
    """The job's next delivery; None (and the job cancelled) if the client went away."""
    while True:
        try:
            return await asyncio.wait_for(inbox.get(), DISCONNECT_POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                job.cancelled.set()
                return None


async def _body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large(int(declared))
    parts: list[bytes] = []
    size = 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > MAX_BODY_BYTES:
                raise _too_large(size)
            parts.append(part)
    except ClientDisconnect:  # gone, or closed for a body too slow: no one to answer
        raise ApiError(499, "the client went away", type="cancelled") from None
    return b"".join(parts)


def _host_name(header: str) -> str:
    """The name in a Host header, without its port ("[::1]:8080" -> "::1")."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _too_large(size: int) -> ApiError:
    return ApiError(413, f"the request body is over {MAX_BODY_BYTES:,} bytes ({size:,} read)",
                    code="request_too_large")


def _error(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(ApiError(exc.status_code, exc.detail or "not found",
                           code="not_found" if exc.status_code == 404 else None))


async def _internal_error(_request: Request, exc: Exception) -> Response:
    log.error("an API request failed: %s: %s", type(exc).__name__, exc)
    return _error(ApiError(500, "an internal error stopped the request", type="server_error"))


# --- running -------------------------------------------------------------------------------


class Server:
    """uvicorn on a socket of our own (port 0 picks a free one), on the calling thread
    (`run`) or a thread of its own (`start`, for the app and the tests)."""

    def __init__(self, worker: ApiWorker, model_id: Callable[[], str],
                 options: ServerOptions) -> None:
        check_binding(options)
        self.worker = worker
        family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((options.host, options.port))
        self.host, self.port = self.socket.getsockname()[:2]
        # h11 under Arbor's guard (engine.api.guard), whatever else is installed; no
        # WebSocket upgrades.
        config = uvicorn.Config(create_app(worker, model_id, options), log_level="warning",
                                lifespan="off", access_log=False, ws="none",
                                http=guarded_protocol(options.limits, fd_limit()),
                                backlog=BACKLOG, timeout_graceful_shutdown=5)
        self._server = _Uvicorn(config, on_stopping=worker.stop)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def run(self, on_started: Callable[[], None] | None = None) -> None:
        """Serve until told to stop (or, on the main thread, until Ctrl+C, which ends it with
        a KeyboardInterrupt). `on_started` is called once connections are accepted."""
        self._server.on_started = on_started
        self._server.run(sockets=[self.socket])
        # uvicorn raises the signal again once it has stopped, under the handler that was
        # there before it. Where that one does not turn it into a KeyboardInterrupt (SIGINT
        # ignored, as for a job a shell starts in the background; once in 16 runs under load
        # here, serve ended with status 0 and no word), this does.
        if signal.SIGINT in self._server.captured:
            raise KeyboardInterrupt

    def start(self) -> None:
        self._server.config.install_signal_handlers = False  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self.run, name="arbor-api-http", daemon=True)
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            threading.Event().wait(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join()
        self.socket.close()


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling when it accepts connections, and ending the API's worker's
    jobs before it waits for the requests still open (those waiting for a reply would
    otherwise hold it for its whole grace period, and then be cut off)."""

    def __init__(self, config: uvicorn.Config, *, on_stopping: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_started: Callable[[], None] | None = None
        self._on_stopping = on_stopping
        self.captured: set[int] = set()  # the signals that stopped it

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit and self.on_started is not None:
            self.on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_stopping()
        await super().shutdown(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.captured.add(sig)
        super().handle_exit(sig, frame)


def model_id_of(path: Path) -> str:
    return path.stem

