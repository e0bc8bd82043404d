"""llama.cpp's own server, `llama-server`, as the benchmark runs it: the peer users who serve
models pick, with its context checkpoints and host-memory prompt cache on (its defaults).

It is built once from the llama.cpp that the llama-cpp-python sdist vendors (the one `make`
keeps in `~/.cache/arbor/wheels-<backend>`, as for the RPC worker), portable as the wheel is
(`GGML_NATIVE=OFF`, `GGML_BACKEND_DL=ON`), without the web UI, curl or OpenSSL, into
`~/.cache/arbor/llama-server`. It then runs on the CPU library Arbor's engine chose from the
installed wheel (`GGML_BACKEND_PATH`, with no other CPU library beside the program), and
without weight repacking where Arbor's engine turns it off: both run the same kernels.
Building takes about ten minutes on two cores; a build that cannot be made says why.

This module loads no native library itself; `cpu_library()` asks the engine's loader.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.core.errors import ArborError
from engine.llm.backends import cpu_variants, library_dir
from engine.llm.rpc import SDIST_DIRS, find_sdist, llama_cpp_version

log = logging.getLogger(__name__)

PROGRAM = "llama-server"
# Beside the wheels `make` keeps (not under ARBOR_HOME, which a benchmark run points at its
# output folder): built once per llama-cpp-python install, for every run after.
BUILDS = SDIST_DIRS[0].parent / PROGRAM
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    # As the wheel: portable, backends as libraries (the CPU one is the wheel's own, below).
    "-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=OFF",
    "-DGGML_RPC=OFF",
    # Nothing fetched or linked from outside: no curl, no OpenSSL, no web UI download.
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    # The program finds its libraries beside itself, wherever the folder is moved.
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)


class ServerAbsent(ArborError):
    """A server the benchmark cannot run here; the message says why."""


@dataclass(frozen=True)
class Options:
    """What the benchmark sets; llama-server's defaults for everything else."""

    n_ctx: int
    n_batch: int
    n_threads: int
    swa_full: bool = False


def program_folder(root: Path | None = None) -> Path:
    """Where this llama-cpp-python install's llama-server lives (one per install)."""
    build = hashlib.sha256(str(library_dir().resolve()).encode()).hexdigest()[:8]
    return (root or BUILDS) / f"{llama_cpp_version()}-{build}"


def program(root: Path | None = None) -> Path:
    """The llama-server program: built on first use (minutes), then found."""
    folder = program_folder(root)
    binary = folder / PROGRAM
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    try:
        sdist = find_sdist(llama_cpp_version())
    except ArborError as exc:
        raise ServerAbsent(str(exc)) from None
    for tool in ("cmake", os.environ.get("CXX", "g++")):
        if shutil.which(tool) is None:
            raise ServerAbsent(f"building llama-server needs {tool}")
    log.info("building llama-server from %s (about ten minutes, once)", sdist.name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="arbor-llama-server-") as tmp:
        source = _extract(sdist, Path(tmp) / "src")
        build = Path(tmp) / "build"
        _run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], "configuring")
        _run(["cmake", "--build", str(build), "--target", PROGRAM, "-j",
              str(os.cpu_count() or 1)], "building")
        staged = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder.parent))
        try:
            for path in (build / "bin").iterdir():
                if path.name == PROGRAM or (path.name.startswith("lib") and ".so" in path.name
                                            and not path.name.startswith("libggml-cpu")):
                    shutil.copy2(path, staged / path.name, follow_symlinks=False)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(staged, folder)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
    log.info("built %s", binary)
    return binary


def _extract(sdist: Path, into: Path) -> Path:
    prefix = sdist.name.removesuffix(".tar.gz") + "/vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        archive.extractall(into, members=members, filter="data")
    return into / prefix


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip())[-400:]
        raise ServerAbsent(f"{what} llama-server failed: {said}")


def cpu_library(model: Path) -> tuple[Path | None, bool]:
    """The CPU library Arbor's engine runs `model` on (None: a build with it linked in) and
    whether it repacks the weights, as this process's engine decides them."""
    from engine.llm.llama import native_backends
    from engine.llm.repack import RepackGuard

    backends = native_backends()
    library = cpu_variants(library_dir()).get(backends.cpu_variant)
    return library, RepackGuard(model, backends).decide().repack


def command(model: Path, *, host: str, port: int, options: Options) -> tuple[list[str],
                                                                              dict[str, str]]:
    """The command line and environment that serve `model` as the benchmark does."""
    binary = program()
    library, repack = cpu_library(model)
    if library is None:
        raise ServerAbsent("this llama-cpp-python build has its CPU code linked in: "
                           "llama-server would run other kernels than Arbor")
    args = [str(binary), "--model", str(model), "--host", host, "--port", str(port),
            "--ctx-size", str(options.n_ctx), "--batch-size", str(options.n_batch),
            "--ubatch-size", str(options.n_batch), "--threads", str(options.n_threads),
            "--threads-batch", str(options.n_threads)]
    if options.swa_full:
        args.append("--swa-full")
    if not repack:
        args.append("--no-repack")
    return args, {"GGML_BACKEND_PATH": str(library)}
