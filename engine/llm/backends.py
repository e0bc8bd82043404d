"""llama.cpp's backends: which native libraries run this process's models, chosen once.

`make` and the bundles build llama.cpp portable (`GGML_NATIVE=OFF`, `GGML_BACKEND_DL=ON`,
`GGML_CPU_ALL_VARIANTS=ON`): the CPU backend is one loadable library per instruction-set level
(`libggml-cpu-x64.so` ... `-haswell`, `-zen4`, `-sapphirerapids`) and each GPU or RPC backend is
a library of its own, all beside libllama. llama.cpp loads none of them by itself, and its
`ggml_backend_load_all` looks beside the executable (Python's), so Arbor loads them here from
the folder llama-cpp-python loads libllama from:

- every GPU and RPC backend present (one that cannot start, say CUDA without a driver, is
  left out and named);
- of the CPU variants, the best this CPU runs (each library scores itself against the CPU,
  as llama.cpp's own loader asks), except one with AMX on a CPU with AMX: the vendored
  llama.cpp's AMX kernels crash on any batch of two or more tokens there (ggml-org/llama.cpp
  #20824), so such a CPU runs the best variant without them (AVX-512 with its own repacking).

A build with its backends linked in (a native build, macOS) has nothing to load; if its CPU
code has AMX and the CPU too, `Backends.repack_known_bad` says so and models load without
weight repacking (engine.llm.repack).

Nothing here loads a library before `load()` is called: the window's process never does.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.llm.cpu import cpu_flags, has_amx

log = logging.getLogger(__name__)

# The GPU and RPC backends a portable build may carry, in llama.cpp's own loading order.
OTHER_BACKENDS = ("blas", "cuda", "hip", "metal", "rpc", "sycl", "vulkan", "opencl", "musa")


def library_name(base: str) -> str:
    """`base`'s file name on this platform (`ggml` -> libggml.so, ggml.dll, libggml.dylib)."""
    if sys.platform == "win32":
        return f"{base}.dll"
    return f"lib{base}.dylib" if sys.platform == "darwin" else f"lib{base}.so"


def linked_file(folder: Path, base: str) -> Path:
    """The file of `base` in `folder` that the others link (by its versioned name,
    `libggml.so.0`): a wheel holds copies, not links, of `libggml.so`, and a copy loaded
    beside it would be a second llama.cpp with a backend registry of its own."""
    plain = library_name(base)
    versioned = f"{plain}.0" if plain.endswith(".so") else plain.replace(".dylib", ".0.dylib")
    for name in (versioned, plain):
        if (folder / name).exists():
            return folder / name
    return folder / plain


def library_dir() -> Path:
    """The folder llama-cpp-python loads libllama from (it honours LLAMA_CPP_LIB_PATH),
    found without importing it."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise ImportError("llama-cpp-python is not installed")
    return Path(spec.origin).parent / "lib"


def cpu_variants(folder: Path) -> dict[str, Path]:
    """The CPU variant libraries in `folder`, by variant name (empty: not a portable build)."""
    prefix, suffix = library_name("ggml-cpu-").split("ggml-cpu-")
    found: dict[str, Path] = {}
    for path in sorted(folder.glob(f"{prefix}ggml-cpu-*{suffix}")):
        variant = path.name[len(prefix) + len("ggml-cpu-"):len(path.name) - len(suffix)]
        if variant:
            found[variant] = path
    return found


@dataclass(frozen=True)
class Backends:
    """What `load()` found and chose."""

    portable: bool  # backends as loadable libraries (else linked into libggml)
    cpu_variant: str  # the CPU library chosen ("native": a build with one, linked in)
    cpu_features: dict[str, str] = field(default_factory=dict)  # as that library reports them
    loaded: tuple[str, ...] = ()  # other backends loaded (gpu, rpc)
    skipped: tuple[str, ...] = ()  # in words: what was left out and why
    repack_known_bad: bool = False  # weight repacking is known to crash with these kernels

    def describe(self) -> str:
        """One line for logs and reports."""
        parts = [f"CPU variant {self.cpu_variant}"]
        if self.loaded:
            parts.append("with " + ", ".join(self.loaded))
        if self.skipped:
            parts.append("(" + "; ".join(self.skipped) + ")")
        return " ".join(parts)


class _Feature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


_lock = threading.Lock()
_ggml_lib: ctypes.CDLL | None = None
_loaded: Backends | None = None


def ggml() -> ctypes.CDLL:
    """libggml's registry functions (llama-cpp-python binds only libllama's), from the folder
    libllama comes from."""
    global _ggml_lib
    with _lock:
        if _ggml_lib is None:
            lib = ctypes.CDLL(str(linked_file(library_dir(), "ggml")))
            vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
            for name, args, result in (
                ("ggml_backend_load", [cp], vp),
                ("ggml_backend_reg_count", [], sz),
                ("ggml_backend_reg_by_name", [cp], vp),
                ("ggml_backend_reg_name", [vp], cp),
                ("ggml_backend_reg_get_proc_address", [vp, cp], vp),
                ("ggml_backend_register", [vp], None),
                ("ggml_backend_reg_dev_count", [vp], sz),
                ("ggml_backend_reg_dev_get", [vp, sz], vp),
                ("ggml_backend_dev_count", [], sz),
                ("ggml_backend_dev_get", [sz], vp),
                ("ggml_backend_dev_type", [vp], ctypes.c_int),
                ("ggml_backend_dev_name", [vp], cp),
                ("ggml_backend_dev_description", [vp], cp),
                ("ggml_backend_dev_memory", [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
            ):
                function = getattr(lib, name)
                function.argtypes, function.restype = args, result
            _ggml_lib = lib
        return _ggml_lib


def features(reg: int | None) -> dict[str, str]:
    """A backend's compiled-in features (`ggml_backend_get_features`), e.g. {"AVX2": "1"}."""
    if not reg:
        return {}
    address = ggml().ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
    if not address:
        return {}
    get = ctypes.CFUNCTYPE(ctypes.POINTER(_Feature), ctypes.c_void_p)(address)
    found: dict[str, str] = {}
    items = get(reg)
    i = 0
    while items and items[i].name is not None:
        found[items[i].name.decode()] = (items[i].value or b"").decode()
        i += 1
    return found


def _amx(found: dict[str, str]) -> bool:
    return any(found.get(name) not in (None, "", "0") for name in ("AMX_INT8", "AMX_TILE"))


def choose_cpu_variant(scores: dict[str, int], amx_cpu: bool,
                       has_amx_kernels: Callable[[str], bool]) -> tuple[str | None, list[str]]:
    """Of the variants this CPU runs (score > 0, as each library scores itself), the best;
    on an AMX CPU the best without AMX kernels. Also what was passed over, in words."""
    skipped: list[str] = []
    for name in sorted((n for n, s in scores.items() if s > 0), key=lambda n: -scores[n]):
        if amx_cpu and has_amx_kernels(name):
            skipped.append(f"{name} left out: llama.cpp's AMX kernels crash on this CPU")
            continue
        return name, skipped
    return None, skipped


def _scores(variants: dict[str, Path]) -> dict[str, int]:
    scores: dict[str, int] = {}
    for name, path in variants.items():
        try:
            score_fn = ctypes.CDLL(str(path)).ggml_backend_score
        except (OSError, AttributeError) as exc:
            log.warning("CPU variant %s cannot be loaded: %s", name, exc)
            continue
        score_fn.argtypes, score_fn.restype = [], ctypes.c_int
        scores[name] = int(score_fn())
    return scores


def _variant_has_amx(path: Path) -> bool:
    """Whether a CPU library has AMX kernels (only asked of one this CPU runs)."""
    init = ctypes.CDLL(str(path)).ggml_backend_init
    init.argtypes, init.restype = [], ctypes.c_void_p
    return _amx(features(init()))


def load() -> Backends:
    """Load this build's backends once per process (a no-op for a build with them linked in)
    and say what runs."""
    global _loaded
    if _loaded is not None:
        return _loaded
    lib = ggml()
    folder = library_dir()
    amx_cpu = has_amx(cpu_flags())
    variants = cpu_variants(folder)
    built_in = bool(lib.ggml_backend_reg_by_name(b"CPU"))
    if built_in or not variants:
        cpu = features(lib.ggml_backend_reg_by_name(b"CPU"))
        result = Backends(portable=False, cpu_variant="native", cpu_features=cpu,
                          repack_known_bad=amx_cpu and _amx(cpu))
    else:
        loaded: list[str] = []
        skipped: list[str] = []
        for name in OTHER_BACKENDS:
            path = folder / library_name(f"ggml-{name}")
            if not path.exists():
                continue
            if lib.ggml_backend_load(str(path).encode()):
                loaded.append(name)
            else:
                skipped.append(f"{name} could not start (no driver or device?)")
        variant, passed = choose_cpu_variant(
            _scores(variants), amx_cpu, lambda name: _variant_has_amx(variants[name]))
        skipped += passed
        if variant is None:
            raise OSError("none of llama.cpp's CPU libraries runs on this CPU")
        reg = lib.ggml_backend_load(str(variants[variant]).encode())
        if not reg:
            raise OSError(f"llama.cpp's CPU library {variant} could not be loaded")
        result = Backends(portable=True, cpu_variant=variant, cpu_features=features(reg),
                          loaded=tuple(loaded), skipped=tuple(skipped))
    log.info("llama.cpp: %s", result.describe())
    _loaded = result
    return result
