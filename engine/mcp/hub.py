"""The user's MCP servers, reached with the official `mcp` SDK from one thread of their own.

`McpHub` keeps one connection per server, opened on demand (the first listing or call) and
held open. Every public method returns a `concurrent.futures.Future` at once, so a GUI thread
never waits on a server. A call never raises: what went wrong is a failed `ToolOutcome` whose
text the model reads as the result (the server refused, the call took longer than the
server's timeout, the server died or could not be started). A server that times out or dies is
stopped, and started again by the next listing or call ("restarted on demand").

A stdio server's stderr goes to `<log_dir>/mcp-<name>.log`; headers and environment values are
never logged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import re
import threading
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO, TypeVar

from engine.config.mcp import McpServer, Transport
from engine.core.errors import ArborError, printable

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_RESULT_CHARS = 32_000  # what the model is given of one result; the rest is cut, and said
_CLOSE_S = 5.0  # how long a stopping server may take before it is left to the SDK's kill


class McpError(ArborError):
    """A server could not be reached or listed."""


@dataclass(frozen=True)
class McpTool:
    """A tool a server offers: what the model is told of it."""

    server: str
    name: str
    description: str
    parameters: Mapping[str, Any]  # a JSON schema of its arguments

    def to_openai(self) -> dict[str, Any]:
        """As a conversation offers it to the model (OpenAI's function tool)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": dict(self.parameters)}}


@dataclass(frozen=True)
class ToolOutcome:
    text: str  # the result as the model reads it
    failed: bool = False  # the tool failed, or was not reached: `text` says why


@dataclass
class _Connection:
    server: McpServer
    client: Any = None  # mcp.Client while open
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class McpHub:
    def __init__(self, servers: Sequence[McpServer] = (), *, log_dir: Path | None = None
                 ) -> None:
        self._servers = {s.name: s for s in servers}
        self._log_dir = log_dir
        self._connections: dict[str, _Connection] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp", daemon=True)
        self._thread.start()
        self._closed = False

    # --- the GUI's side: every method returns at once ----------------------------------------

    @property
    def servers(self) -> list[McpServer]:
        return list(self._servers.values())

    def configure(self, servers: Sequence[McpServer]) -> None:
        """New definitions (Settings were saved): a server whose definition changed, or that
        is gone or disabled, is stopped; the rest keep their connections (a tool newly
        allowed always changes nothing that needs a restart)."""
        old, self._servers = self._servers, {s.name: s for s in servers}
        for name, server in old.items():
            new = self._servers.get(name)
            if new is None or _reached(new) != _reached(server):
                self._submit(self._stop(name))

    def allowed(self, server: str, tool: str) -> bool:
        """Whether the user said "always allow" for this tool of this server."""
        known = self._servers.get(server)
        return known is not None and tool in known.always_allowed

    def list_tools(self, server: str) -> concurrent.futures.Future[list[McpTool]]:
        """The server's tools (McpError when it cannot be started or listed)."""
        return self._submit(self._list(server))

    def call(self, server: str, tool: str, arguments: Mapping[str, Any]
             ) -> concurrent.futures.Future[ToolOutcome]:
        return self._submit(self._call(server, tool, dict(arguments)))

    def running(self, server: str) -> bool:
        connection = self._connections.get(server)
        return connection is not None and connection.client is not None

    def close(self) -> None:
        """Stop every server and the hub's thread (waits a few seconds at most)."""
        if self._closed:
            return
        self._closed = True
        future = asyncio.run_coroutine_threadsafe(self._stop_all(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout=_CLOSE_S * 2)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=_CLOSE_S)

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closed:
            raise McpError("the MCP servers were shut down")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # --- the hub's thread --------------------------------------------------------------------

    def _server(self, name: str) -> McpServer:
        server = self._servers.get(name)
        if server is None:
            raise McpError(f"there is no MCP server called {printable(name, 80)} in Settings")
        if not server.enabled:
            raise McpError(f"the MCP server {printable(name, 80)} is turned off in Settings")
        return server

    async def _client(self, name: str) -> Any:
        server = self._server(name)
        connection = self._connections.get(name)
        if connection is None or _reached(connection.server) != _reached(server):
            if connection is not None:
                await self._stop(name)
            connection = self._connections[name] = _Connection(server)
        async with connection.lock:
            if connection.client is None:
                await self._open(connection)
            return connection.client

    async def _open(self, connection: _Connection) -> None:
        server = connection.server
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        connection.stop = asyncio.Event()
        connection.task = asyncio.create_task(self._hold(connection, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), server.timeout_s)
        except TimeoutError:
            await self._end(connection)
            raise McpError(f"the MCP server {printable(server.name, 80)} did not start "
                           f"within {server.timeout_s} s") from None
        except Exception as exc:
            await self._end(connection)
            raise McpError(f"the MCP server {printable(server.name, 80)} could not be "
                           f"started: {_describe(exc)}") from None

    async def _hold(self, connection: _Connection, ready: asyncio.Future[None]) -> None:
        """Keep the connection open until asked to stop (the SDK's context must be left by
        the task that entered it)."""
        from mcp import Client

        server = connection.server
        with _errlog(self._log_dir, server) as errlog:
            try:
                async with Client(_transport(server, errlog), mode="auto") as client:
                    connection.client = client
                    ready.set_result(None)
                    log.info("MCP server %s started", server.name)
                    await connection.stop.wait()
            except BaseException as exc:  # the SDK raises groups; the task is ours to end
                if not ready.done():
                    ready.set_exception(exc if isinstance(exc, Exception)
                                        else McpError("cancelled"))
                log.info("MCP server %s stopped: %s", server.name, _describe(exc))
                if isinstance(exc, asyncio.CancelledError):
                    raise
            finally:
                connection.client = None

    async def _end(self, connection: _Connection) -> None:
        connection.stop.set()
        task = connection.task
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), _CLOSE_S)
        except (TimeoutError, Exception):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        connection.client = None

    async def _stop(self, name: str) -> None:
        connection = self._connections.pop(name, None)
        if connection is not None:
            await self._end(connection)

    async def _stop_all(self) -> None:
        await asyncio.gather(*(self._stop(name) for name in list(self._connections)))

    async def _list(self, name: str) -> list[McpTool]:
        client = await self._client(name)
        server = self._server(name)
        tools: list[McpTool] = []
        cursor: str | None = None
        try:
            for _ in range(100):  # pages; a server that pages forever is cut off
                page = await asyncio.wait_for(client.list_tools(cursor=cursor),
                                              server.timeout_s)
                tools.extend(McpTool(name, t.name, t.description or "", t.input_schema or
                                     {"type": "object"}) for t in page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
        except Exception as exc:
            await self._stop(name)
            raise McpError(f"the MCP server {printable(name, 80)} could not list its tools: "
                           f"{_describe(exc)}") from None
        return tools

    async def _call(self, name: str, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        try:
            server = self._server(name)
            client = await self._client(name)
        except McpError as exc:
            return ToolOutcome(f"Error: {exc}", failed=True)
        try:
            result = await asyncio.wait_for(client.call_tool(tool, arguments),
                                            server.timeout_s)
        except TimeoutError:
            await self._stop(name)
            return ToolOutcome(f"Error: the tool {tool} did not answer within "
                               f"{server.timeout_s} s (its server was stopped, and starts "
                               f"again on the next call)", failed=True)
        except Exception as exc:
            connection = self._connections.get(name)
            gone = connection is None or connection.client is None or connection.stop.is_set()
            if gone or not _is_protocol_error(exc):
                await self._stop(name)
                return ToolOutcome(f"Error: the MCP server {name} stopped during the call "
                                   f"({_describe(exc)}); it starts again on the next call",
                                   failed=True)
            return ToolOutcome(f"Error: {_describe(exc)}", failed=True)
        return ToolOutcome(_result_text(result), failed=bool(result.is_error))


def _reached(server: McpServer) -> McpServer:
    """What connecting to `server` depends on."""
    return replace(server, always_allowed=())


@contextlib.contextmanager
def _errlog(log_dir: Path | None, server: McpServer) -> Any:
    """Where a stdio server's stderr goes: a log file of its own (never the app's terminal:
    the SDK hands it to the child process, which needs a real file)."""
    if server.transport is not Transport.STDIO:
        yield None
        return
    path = Path("/dev/null")
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"mcp-{re.sub(r'[^A-Za-z0-9_.-]', '_', server.name)}.log"
    try:
        handle = path.open("a", encoding="utf-8")
    except OSError:
        handle = Path("/dev/null").open("a", encoding="utf-8")  # noqa: SIM115 (closed below)
    with handle:
        yield handle


def _transport(server: McpServer, errlog: TextIO | None) -> Any:
    if server.transport is Transport.STDIO:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        parameters = StdioServerParameters(command=server.command, args=list(server.args),
                                           env=dict(server.env) or None)
        return stdio_client(parameters, errlog=errlog) if errlog else stdio_client(parameters)
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    return streamable_http_client(server.url,
                                  http_client=create_mcp_http_client(dict(server.headers)))


def _is_protocol_error(exc: BaseException) -> bool:
    """An error the server answered with (the connection is fine), not a broken pipe."""
    from mcp.shared.exceptions import MCPError

    return isinstance(exc, MCPError) and "closed" not in str(exc).lower()


def _describe(exc: BaseException) -> str:
    """One line for the user: the innermost error of the SDK's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip() or type(exc).__name__
    return printable(text.splitlines()[0] if text else text, 300)


def _result_text(result: Any) -> str:
    """What the model reads of a result: its text parts; other parts named; the structured
    content when there is no text; cut at MAX_RESULT_CHARS."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {block.mime_type}]")
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource: {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        cut = len(text) - MAX_RESULT_CHARS
        text = f"{text[:MAX_RESULT_CHARS]}\n[… {cut:,} more characters were cut]"
    return text

