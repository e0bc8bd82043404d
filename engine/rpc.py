"""llama.cpp RPC workers: addresses, the reachability probe, and the worker program.

A worker is llama.cpp's `ggml-rpc-server` on another machine (or this one): the engine
registers it as a device and places layers on it. Registration is process-wide and cannot be
undone, and a worker that does not answer makes llama.cpp abort the whole process, so every
address is probed (a TCP connect with a timeout) before it is registered.

The worker program is built once from the source the llama-cpp-python sdist vendors
(`tools/rpc/rpc-server.cpp`), against the installed library: it then speaks exactly this
build's protocol. `make` keeps that sdist in `~/.cache/arbor/wheels-<backend>`.

This module loads no native library.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.backends import cpu_variants, library_dir
from engine.errors import ArborError
from engine.paths import data_dirs

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
SDIST_DIRS = tuple(Path.home() / ".cache" / "arbor" / f"wheels-{backend}"
                   for backend in ("cpu", "cuda", "vulkan", "metal"))
_WORKER_SOURCE = "tools/rpc/rpc-server.cpp"


class RpcError(ArborError):
    """A worker address that is not one, a worker that does not answer, or a worker program
    that cannot be built."""


class WorkersUnreachable(RpcError):
    """Workers that did not accept a connection (llama.cpp would abort on them)."""

    def __init__(self, gone: list[tuple[Endpoint, str]]) -> None:
        self.endpoints = tuple(str(e) for e, _ in gone)
        said = "; ".join(f"{e} ({why})" for e, why in gone)
        super().__init__(f"the RPC worker{'s' if len(gone) > 1 else ''} {said} "
                         f"{'do' if len(gone) > 1 else 'does'} not answer: start "
                         f"`arbor-engine rpc-worker` there, or remove the address")


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


def probe(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None if something accepts connections there, else why not (one short phrase)."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    except UnicodeError:  # a name the resolver cannot be asked for
        return "not a host name the resolver can look up"


def unreachable(endpoints: tuple[Endpoint, ...]) -> list[tuple[Endpoint, str]]:
    return [(e, why) for e in endpoints if (why := probe(e)) is not None]


# --- the worker program ----------------------------------------------------------------------


def llama_cpp_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def llama_lib_dir() -> Path:
    """The installed llama-cpp-python's shared libraries (found without importing it)."""
    try:
        return library_dir()
    except ImportError:
        raise RpcError("llama-cpp-python is not installed") from None


def build_supports_rpc() -> bool:
    return any(llama_lib_dir().glob("libggml-rpc.*"))


def worker_program(folder: Path | None = None) -> Path:
    """The worker for this llama-cpp-python build: built once (into `folder`, default the
    user cache dir), then found."""
    version = llama_cpp_version()
    lib = llama_lib_dir()
    build = hashlib.sha256(str(lib.resolve()).encode()).hexdigest()[:8]  # one per install
    program = (folder or data_dirs().cache / "rpc") / f"ggml-rpc-server-{version}-{build}"
    if program.is_file() and os.access(program, os.X_OK):
        return program
    if not build_supports_rpc():
        raise RpcError("this llama-cpp-python build has no RPC backend; run `make` (it builds "
                       "one with RPC on), or reinstall with CMAKE_ARGS=\"-DGGML_RPC=on\"")
    sdist = _find_sdist(version)
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise RpcError("building the RPC worker needs a C++ compiler (g++)")
    program.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = _extract(sdist, Path(tmp))
        source = root / _WORKER_SOURCE
        if cpu_variants(lib):
            # A portable build: its backends are libraries the worker loads, from beside
            # libllama (llama.cpp's own search looks beside the worker program).
            text = source.read_text(encoding="utf-8")
            source.write_text(text.replace(
                "ggml_backend_load_all();",
                f"ggml_backend_load_all_from_path({json.dumps(str(lib))});"), encoding="utf-8")
        partial = program.with_name(program.name + ".tmp")
        command = [compiler, "-std=c++17", "-O2", "-I", str(root / "ggml" / "include"),
                   str(source), "-o", str(partial), "-L", str(lib),
                   "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}", "-pthread"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RpcError(f"building the RPC worker failed: {done.stderr.strip()[-300:]}")
        os.replace(partial, program)
    log.info("built the RPC worker %s", program)
    return program


def _find_sdist(version: str) -> Path:
    name = f"llama_cpp_python-{version}.tar.gz"
    for folder in (*(Path(p) for p in os.environ.get("ARBOR_LLAMA_SDIST_DIR", "").split(
            os.pathsep) if p), *SDIST_DIRS):
        if (folder / name).is_file():
            return folder / name
    raise RpcError(f"the RPC worker is built from {name}, which `make` keeps in "
                   f"{SDIST_DIRS[0]}; it is not there")


def _extract(sdist: Path, into: Path) -> Path:
    """Only what the worker needs: its source and ggml's headers."""
    prefix = sdist.name.removesuffix(".tar.gz") + "/vendor/llama.cpp/"
    wanted = (prefix + _WORKER_SOURCE, prefix + "ggml/include/")
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers()
                   if m.isfile() and m.name.startswith(wanted)]
        archive.extractall(into, members=members, filter="data")
    return into / prefix


def run_worker(host: str, port: int, threads: int = 0) -> int:
    """Run a worker in the foreground until interrupted; its exit status."""
    program = worker_program()
    command = [str(program), "--host", host, "--port", str(port)]
    if threads:
        command += ["--threads", str(threads)]
    return subprocess.call(command)
