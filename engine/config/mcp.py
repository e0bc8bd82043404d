"""MCP servers the user has added (Settings → Tools): how to reach each one, how long a call
may take, and the tools the user has allowed to run without asking.

A server is reached over stdio (a command Arbor starts, with its arguments and extra
environment) or streamable HTTP (a URL, with extra headers such as an Authorization). The
definitions are saved in the settings file; like the API key, headers and environment are kept
there in plain text (the file is the user's own, 0600 where the OS allows), and never logged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from engine.core.errors import printable

MAX_MCP_SERVERS = 32
MAX_FIELD_CHARS = 4096
DEFAULT_TIMEOUT_S = 60
MAX_TIMEOUT_S = 3600
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token


class Transport(StrEnum):
    STDIO = "stdio"  # a command Arbor starts; messages over its stdin and stdout
    HTTP = "http"  # streamable HTTP at a URL

    @property
    def label(self) -> str:
        return {Transport.STDIO: "Command (stdio)", Transport.HTTP: "URL (streamable HTTP)"}[self]


@dataclass(frozen=True)
class McpServer:
    name: str  # the user's name for it, unique among the servers
    transport: Transport = Transport.STDIO
    command: str = ""  # stdio: the program
    args: tuple[str, ...] = ()  # stdio: its arguments
    env: Mapping[str, str] = field(default_factory=dict)  # stdio: over the app's environment
    url: str = ""  # http: the endpoint
    headers: Mapping[str, str] = field(default_factory=dict)  # http: sent with every request
    timeout_s: int = DEFAULT_TIMEOUT_S  # a call that takes longer fails (and the server restarts)
    enabled: bool = True
    always_allowed: tuple[str, ...] = ()  # tools that run without asking ("always allow")

    def __post_init__(self) -> None:
        object.__setattr__(self, "transport", Transport(self.transport))
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "headers", dict(self.headers))
        object.__setattr__(self, "always_allowed", tuple(self.always_allowed))

    def problems(self) -> list[str]:
        """What is wrong with this definition, in words (empty: nothing)."""
        out: list[str] = []
        where = f"MCP server {printable(self.name, 80)}"
        if not _NAME.fullmatch(self.name):
            out.append(f"{where}: a name is 1-64 letters, digits, spaces, '.', '_' or '-', "
                       f"starting with a letter or digit")
        if self.transport is Transport.STDIO:
            if not self.command.strip():
                out.append(f"{where}: a command is needed to start it")
            for name in self.env:
                if not _ENV_NAME.fullmatch(name):
                    out.append(f"{where}: {printable(name, 80)} is not an environment "
                               f"variable's name")
        else:
            if not re.fullmatch(r"https?://[^\s/?#]+[^\s]*", self.url):
                out.append(f"{where}: the URL must start with http:// or https:// and hold "
                           f"no spaces")
            for name, value in self.headers.items():
                if not _HEADER_NAME.fullmatch(name) or any(c in value for c in "\r\n\0"):
                    out.append(f"{where}: {printable(name, 80)} is not a header Arbor can send")
        texts = [self.command, self.url, *self.args, *self.env.values(),
                 *self.headers.values(), *self.always_allowed]
        if any(len(t) > MAX_FIELD_CHARS or "\0" in t for t in texts):
            out.append(f"{where}: a value is longer than {MAX_FIELD_CHARS} characters or "
                       f"holds a NUL")
        if not 1 <= self.timeout_s <= MAX_TIMEOUT_S:
            out.append(f"{where}: the timeout must be between 1 and {MAX_TIMEOUT_S} seconds")
        return out

    def with_allowed(self, tool: str) -> McpServer:
        """This server with `tool` allowed to run without asking."""
        if tool in self.always_allowed:
            return self
        return McpServer(**{**self.to_json(), "always_allowed": (*self.always_allowed, tool)})

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "transport": self.transport.value,
                "command": self.command, "args": list(self.args), "env": dict(self.env),
                "url": self.url, "headers": dict(self.headers), "timeout_s": self.timeout_s,
                "enabled": self.enabled, "always_allowed": list(self.always_allowed)}

    @staticmethod
    def from_json(raw: object) -> McpServer:
        """One server of the settings file; TypeError/ValueError saying what is wrong."""
        if not isinstance(raw, dict):
            raise TypeError("expected an object per MCP server")
        known = {"name", "transport", "command", "args", "env", "url", "headers",
                 "timeout_s", "enabled", "always_allowed"}
        values = {k: v for k, v in raw.items() if k in known}
        if not isinstance(values.get("name"), str):
            raise TypeError("an MCP server needs a name")
        transport = values.get("transport", Transport.STDIO.value)
        if transport not in {t.value for t in Transport}:
            raise ValueError(f"an MCP server's transport is stdio or http, not "
                             f"{printable(transport, 40)}")
        for key in ("command", "url"):
            if not isinstance(values.get(key, ""), str):
                raise TypeError(f"an MCP server's {key} must be a string")
        for key in ("args", "always_allowed"):
            items = values.get(key, [])
            if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
                raise TypeError(f"an MCP server's {key} must be a list of strings")
        for key in ("env", "headers"):
            table = values.get(key, {})
            if not isinstance(table, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
                raise TypeError(f"an MCP server's {key} must map names to strings")
        timeout = values.get("timeout_s", DEFAULT_TIMEOUT_S)
        if not isinstance(timeout, int) or isinstance(timeout, bool):
            raise TypeError("an MCP server's timeout must be a whole number of seconds")
        if not isinstance(values.get("enabled", True), bool):
            raise TypeError("an MCP server's enabled must be true or false")
        return McpServer(**values)


def server_problems(servers: tuple[McpServer, ...]) -> list[str]:
    out = [p for server in servers for p in server.problems()]
    names = [s.name.casefold() for s in servers]
    if len(set(names)) != len(names):
        out.append("two MCP servers have the same name")
    if len(servers) > MAX_MCP_SERVERS:
        out.append(f"at most {MAX_MCP_SERVERS} MCP servers")
    return out
