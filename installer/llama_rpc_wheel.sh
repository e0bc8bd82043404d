#!/usr/bin/env bash
# Install llama-cpp-python built with llama.cpp's RPC backend (remote workers) into a venv.
#
#   installer/llama_rpc_wheel.sh PYTHON VERSION [DIR]
#
# pip caches wheels by version, not by CMAKE_ARGS: a cached build without RPC would be reused
# silently. So Arbor keeps its own RPC build, and the sdist it came from (the RPC worker is
# compiled from it), in DIR (default ~/.cache/arbor/wheels-rpc), and checks the result.
set -euo pipefail
PY="$1"
VERSION="$2"
DIR="${3:-$HOME/.cache/arbor/wheels-rpc}"

has_rpc() {
  "$PY" -c 'import sys, llama_cpp; sys.exit(0 if llama_cpp.llama_supports_rpc() else 1)' \
    2>/dev/null
}
installed() {
  "$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null \
    || true
}

mkdir -p "$DIR"
SDIST="$DIR/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  "$PY" -m pip download --quiet --no-deps --no-binary :all: -d "$DIR" \
    "llama-cpp-python==$VERSION"
fi
if [ "$(installed)" = "$VERSION" ] && has_rpc; then
  exit 0
fi
# The wheel is tagged py3-none-<platform> (its libraries are loaded through ctypes).
PLATFORM=$("$PY" -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')
WHEEL=$(ls "$DIR"/llama_cpp_python-"$VERSION"-*-"$PLATFORM".whl 2>/dev/null | head -n 1 || true)
if [ -z "$WHEEL" ]; then
  echo "Building llama-cpp-python $VERSION with RPC on: 7-11 minutes, once." >&2
  CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=on" \
    "$PY" -m pip wheel --quiet --no-deps --no-cache-dir -w "$DIR" "$SDIST"
  WHEEL=$(ls "$DIR"/llama_cpp_python-"$VERSION"-*-"$PLATFORM".whl | head -n 1)
fi
"$PY" -m pip install --quiet --no-deps --force-reinstall "$WHEEL"
"$PY" -m pip install --quiet "$WHEEL"  # its dependencies, if this venv lacks them
if ! has_rpc; then
  echo "llama-cpp-python $VERSION from $WHEEL has no RPC backend; remove it and run again" >&2
  exit 1
fi
