#!/usr/bin/env bash
# Install llama-cpp-python built for one backend, with llama.cpp's RPC backend on, into a venv.
#
#   installer/llama_wheel.sh PYTHON VERSION BACKEND      (BACKEND: cpu, cuda, vulkan, metal)
#
# Linux and Windows builds are portable: GGML_NATIVE=OFF, GGML_BACKEND_DL=ON and
# GGML_CPU_ALL_VARIANTS=ON put one CPU library per instruction-set level (x64 ... zen4,
# sapphirerapids) beside libllama, and Arbor loads the best this CPU runs (engine/llm/backends.py),
# as llama.cpp's own releases do; a GPU backend is one more library beside them. macOS builds
# Metal in, for the Mac it runs on.
#
# pip caches wheels by version, not by CMAKE_ARGS: a cached build of another backend would be
# reused silently. So each backend has its own folder, ~/.cache/arbor/wheels-BACKEND, holding
# its wheel and the sdist it came from (the RPC worker is compiled from it); the folder records
# the flags its wheel was built with (`flags`), a wheel built with other flags is built again,
# and the result is checked for the libraries that backend must have.
#
# libmtmd (LLAVA_BUILD, llama.cpp's multimodal library: images through a model's projector) is
# built for every backend; it links only llama and ggml.
set -euo pipefail
PY="$1"
VERSION="$2"
BACKEND="$3"
DIR="${ARBOR_WHEEL_DIR:-$HOME/.cache/arbor/wheels-$BACKEND}"

FLAGS="-DGGML_RPC=ON -DLLAVA_BUILD=ON"
# GGML_BACKEND_DIR is where ggml installs the backend libraries: relative to the wheel's root,
# so typed STRING (a PATH given on the command line is made absolute against the build folder,
# and the libraries miss the wheel).
case "$(uname -s)" in
  Darwin) ;;  # Metal on, native: one Mac, one build
  *) FLAGS="$FLAGS -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
-DGGML_BACKEND_DIR:STRING=llama_cpp/lib" ;;
esac
case "$BACKEND" in
  cpu|metal) ;;
  cuda) FLAGS="$FLAGS -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-native}" ;;
  vulkan) FLAGS="$FLAGS -DGGML_VULKAN=ON" ;;
  *) echo "llama_wheel: unknown backend '$BACKEND' (cpu, cuda, vulkan, metal)" >&2; exit 2 ;;
esac

# What the install must hold: the RPC backend, and this backend's own library.
check() {
  "$PY" - "$BACKEND" <<'PYCHECK'
import importlib.util, pathlib, sys
backend = sys.argv[1]
lib = pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"
names = {p.name for p in lib.iterdir()}
def has(stem): return any(n.startswith(f"libggml-{stem}") or n.startswith(f"ggml-{stem}") for n in names)
missing = [what for what, ok in (
    ("the RPC backend", has("rpc")),
    ("libmtmd", any(n.startswith(("libmtmd", "mtmd")) for n in names)),
    ("CPU variant libraries", sys.platform == "darwin" or has("cpu-x64")),
    (f"the {backend} backend", backend in ("cpu", "metal") or has(backend)),
) if not ok]
if missing:
    print("; ".join(missing), file=sys.stderr)
    sys.exit(1)
PYCHECK
}
installed() {
  "$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null \
    || true
}

mkdir -p "$DIR"
# A wheel cached under other flags (an older Arbor's) is not this build: drop it, keep the sdist.
if [ "$(cat "$DIR/flags" 2>/dev/null)" != "$FLAGS" ]; then
  rm -f "$DIR"/llama_cpp_python-*.whl
  printf '%s' "$FLAGS" > "$DIR/flags"
fi
SDIST="$DIR/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  "$PY" -m pip download --quiet --no-deps --no-binary :all: -d "$DIR" \
    "llama-cpp-python==$VERSION"
fi
STAMP_FILE="$("$PY" -c 'import sys; print(sys.prefix)')/.arbor-llama-backend"
if [ "$(installed)" = "$VERSION" ] && [ "$(cat "$STAMP_FILE" 2>/dev/null)" = "$BACKEND" ] \
    && check 2>/dev/null; then
  exit 0
fi
# The wheel is tagged py3-none-<platform> (its libraries are loaded through ctypes).
PLATFORM=$("$PY" -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')
WHEEL=$(ls "$DIR"/llama_cpp_python-"$VERSION"-*-"$PLATFORM".whl 2>/dev/null | head -n 1 || true)
if [ -z "$WHEEL" ]; then
  echo "Building llama-cpp-python $VERSION for $BACKEND (portable CPU libraries, RPC on):" \
       "about 10 minutes on 2 cores, once." >&2
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}" \
  CMAKE_ARGS="${CMAKE_ARGS:-} $FLAGS" \
    "$PY" -m pip wheel --quiet --no-deps --no-cache-dir -w "$DIR" "$SDIST"
  WHEEL=$(ls "$DIR"/llama_cpp_python-"$VERSION"-*-"$PLATFORM".whl | head -n 1)
fi
"$PY" -m pip install --quiet --no-deps --force-reinstall "$WHEEL"
"$PY" -m pip install --quiet "$WHEEL"  # its dependencies, if this venv lacks them
if ! check; then
  echo "llama-cpp-python $VERSION from $WHEEL lacks the above; remove it and run again" >&2
  exit 1
fi
echo "$BACKEND" > "$STAMP_FILE"
