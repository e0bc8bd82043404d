"""Addresses of llama.cpp RPC workers (`host:port`), as the command line and settings give them."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.errors import ArborError


class RpcError(ArborError):
    """A worker address that is not one, a worker that does not answer, or a worker program
    that cannot be built."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """`host:port` (an IPv6 host in brackets)."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or len(host) > 253 or any(c.isspace() for c in host):
        raise RpcError(f"{text[:80]!r} is not a worker address (host:port)")
    # ASCII digits only: "²".isdigit() is true and int("²") raises.
    if not (port.isascii() and port.isdigit()) or len(port) > 5 \
            or not 1 <= int(port) <= 65535:
        raise RpcError(f"{text[:80]!r}: the port must be a number from 1 to 65535")
    if ":" not in host and not _host_name_ok(host):
        raise RpcError(f"{text[:80]!r} is not a worker address ({host[:80]!r} is not a host "
                       f"name)")
    return Endpoint(host, int(port))


def _host_name_ok(host: str) -> bool:
    """Whether the resolver can be asked for `host`: no empty label (`gpu..lan`), each label
    encodable as DNS needs it (what `socket` would otherwise raise UnicodeError on)."""
    labels = host.removesuffix(".").split(".")
    try:
        return all(labels) and all(0 < len(label.encode("idna")) <= 63 for label in labels)
    except UnicodeError:
        return False


def parse_endpoints(items: str | list[str] | tuple[str, ...]) -> tuple[Endpoint, ...]:
    """Addresses from the command line's `host:port,host:port` or a settings list."""
    parts = items.split(",") if isinstance(items, str) else list(items)
    found = tuple(parse_endpoint(p) for p in parts if p.strip())
    if len(set(found)) != len(found):
        raise RpcError("a worker address is given twice")
    return found
