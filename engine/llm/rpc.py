"""llama.cpp RPC workers: addresses, the reachability probe, and the worker program.

A worker is llama.cpp's `ggml-rpc-server` on another machine (or this one): the engine
registers it as a device and places layers on it. Registration is process-wide and cannot be
undone, a worker that refuses the connection makes llama.cpp abort the whole process, and one
that accepts it but never answers makes llama.cpp wait for its handshake for ever. So every
address is probed before llama.cpp is given it: a connect and llama.cpp's own handshake
(`RPC_CMD_HELLO`), each with a timeout, and the protocol version the worker answers with.

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
import struct
import subprocess
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from engine.config.endpoints import Endpoint, RpcError
from engine.files.paths import data_dirs
from engine.llm.backends import cpu_variants, library_dir

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0  # for the connect, and again for the handshake

# llama.cpp's RPC handshake as the bundled build speaks it (ggml-rpc.h and ggml-rpc.cpp of
# the llama.cpp llama-cpp-python 0.3.36 vendors; tests/engine/llm/test_rpc_addresses.py checks these
# against the sdist when it is at hand). The client sends the command byte, the request's
# size (uint64, little-endian) and the request: its transport capabilities, zeros for plain
# TCP. The worker answers with the response's size (uint64) and the response: major, minor,
# patch, a padding byte, and its capabilities. llama.cpp accepts a worker of the same major
# version whose minor version is not newer than its own.
RPC_PROTO_MAJOR = 7
RPC_PROTO_MINOR = 0
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
_HELLO = struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE)
_HELLO_RSP_SIZE = 4 + RPC_CONN_CAPS_SIZE
SDIST_DIRS = tuple(Path.home() / ".cache" / "arbor" / f"wheels-{backend}"
                   for backend in ("cpu", "cuda", "vulkan", "metal"))
_WORKER_SOURCE = "tools/rpc/rpc-server.cpp"


class WorkersUnreachable(RpcError):
    """Workers that refused the connection, never answered the handshake, or speak another
    protocol version (llama.cpp would abort, or wait for ever, on them)."""

    def __init__(self, gone: list[tuple[Endpoint, str]]) -> None:
        self.endpoints = tuple(str(e) for e, _ in gone)
        said = "; ".join(f"{e} ({why})" for e, why in gone)
        super().__init__(f"the RPC worker{'s' if len(gone) > 1 else ''} {said} "
                         f"{'do' if len(gone) > 1 else 'does'} not answer as this "
                         f"llama.cpp's worker: start `arbor-engine rpc-worker` there, or "
                         f"remove the address")


def probe(endpoint: Endpoint, timeout: float | None = None) -> str | None:
    """None if a worker of this llama.cpp's protocol answers there, else why not (one short
    phrase). `timeout` (default `PROBE_TIMEOUT_S`) bounds the connect, and then the
    handshake. A worker this process holds a connection to (`hold`) is only connected to:
    it serves one client at a time, so its handshake would wait on that connection."""
    timeout = PROBE_TIMEOUT_S if timeout is None else timeout
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as sock:
            if _held[endpoint]:
                return None
            return _hello(sock, timeout)
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    except UnicodeError:  # a name the resolver cannot be asked for
        return "not a host name the resolver can look up"


def _hello(sock: socket.socket, timeout: float) -> str | None:
    """llama.cpp's handshake on a connected socket; None if the worker answers with a
    protocol version llama.cpp accepts, else what went wrong."""
    deadline = time.monotonic() + timeout
    silent = (f"accepted the connection but did not answer the handshake within "
              f"{timeout:g} s: busy with another client, or not a llama.cpp RPC worker")
    try:
        sock.sendall(_HELLO)
        head = _receive(sock, 8, deadline)
        if len(head) < 8:
            return ("closed the connection at the handshake: not a worker of this llama.cpp "
                    f"(RPC protocol {RPC_PROTO_MAJOR}.{RPC_PROTO_MINOR})")
        (size,) = struct.unpack("<Q", head)
        answer = _receive(sock, min(size, _HELLO_RSP_SIZE), deadline)
    except TimeoutError:
        return silent
    if len(answer) < 3:
        return (f"answered the handshake with {size} bytes, not the {_HELLO_RSP_SIZE} of RPC "
                f"protocol {RPC_PROTO_MAJOR}.{RPC_PROTO_MINOR}: a worker of another llama.cpp "
                f"version")
    major, minor, patch = answer[:3]
    if size != _HELLO_RSP_SIZE or major != RPC_PROTO_MAJOR or minor > RPC_PROTO_MINOR:
        return (f"speaks RPC protocol {major}.{minor}.{patch}, this llama.cpp "
                f"{RPC_PROTO_MAJOR}.{RPC_PROTO_MINOR}: a worker of another llama.cpp version")
    return None


def _receive(sock: socket.socket, size: int, deadline: float) -> bytes:
    """Up to `size` bytes (fewer when the peer closes); TimeoutError past `deadline`."""
    data = b""
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def unreachable(endpoints: tuple[Endpoint, ...]) -> list[tuple[Endpoint, str]]:
    return [(e, why) for e in endpoints if (why := probe(e)) is not None]


# Workers a loaded model of this process keeps a connection to (its weights live there).
_held: Counter[Endpoint] = Counter()


def hold(endpoints: Iterable[Endpoint]) -> None:
    """A model placed on these workers is loaded: llama.cpp keeps its connections."""
    _held.update(endpoints)


def release(endpoints: Iterable[Endpoint]) -> None:
    """That model is freed: its connections are closed."""
    _held.subtract(endpoints)
    for endpoint in [e for e, n in _held.items() if n <= 0]:
        del _held[endpoint]


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
    sdist = find_sdist(version)
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


def find_sdist(version: str) -> Path:
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
