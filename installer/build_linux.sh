#!/usr/bin/env bash
# Linux bundles of Arbor: a one-folder PyInstaller build, as a tar.gz and as a .deb, then the
# frozen program's --self-test from the .deb unpacked into a scratch root.
#
#   installer/build_linux.sh PYTHON        (make installer)
set -euo pipefail
PY="$1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/build"
VERSION=$("$PY" -c 'import importlib.metadata as m; print(m.version("arbor-chat"))')
ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)
# What Qt's X11 plugin loads that a desktop may lack (see app/window/system_check.py).
DEPENDS="libxcb-cursor0, libxcb-icccm4, libxcb-keysyms1, libxcb-image0, libxcb-render-util0, \
libxcb-randr0, libxcb-shape0, libxcb-xkb1, libxkbcommon-x11-0, libegl1, libfontconfig1, \
libdbus-1-3"

"$PY" -m pip install --quiet "pyinstaller>=6.10"
rm -rf "$OUT/dist" "$OUT/work" "$OUT/deb" "$OUT/scratch"
"$PY" -m PyInstaller --noconfirm --log-level WARN --distpath "$OUT/dist" \
  --workpath "$OUT/work" "$ROOT/installer/arbor.spec"
APP="$OUT/dist/Arbor"
LIB="$APP/_internal/llama_cpp/lib"
if ! ls "$LIB"/libllama.* >/dev/null 2>&1; then
  echo "build_linux: llama.cpp's libraries are missing from the bundle" >&2
  exit 1
fi
# llama.cpp's multimodal library (images through a model's projector); the self-test loads it.
if ! ls "$LIB"/libmtmd.* >/dev/null 2>&1; then
  echo "build_linux: libmtmd (llama.cpp's multimodal library) is missing from the bundle" >&2
  exit 1
fi
# Every CPU's kernels: one CPU library per instruction-set level, the best chosen at run time.
VARIANTS=$(cd "$LIB" && ls libggml-cpu-*.so 2>/dev/null | sed 's/^libggml-cpu-//; s/\.so$//' \
  | tr '\n' ' ')
if [ -z "$VARIANTS" ] || ! [ -f "$LIB/libggml-cpu-x64.so" ]; then
  echo "build_linux: the bundle has no portable CPU libraries (llama.cpp built native?)" >&2
  exit 1
fi
echo "bundle: llama.cpp CPU libraries: $VARIANTS"
# What every x86-64 CPU runs must hold no AVX (ymm) or AVX-512 (zmm) instruction: libllama,
# libggml, libggml-base and the base CPU library.
for lib in libllama.so libggml.so libggml-base.so libggml-cpu-x64.so; do
  wide=$(objdump -d --no-show-raw-insn "$LIB/$lib" | grep -c '%[yz]mm' || true)
  if [ "$wide" != 0 ]; then
    echo "build_linux: $lib holds $wide AVX/AVX-512 instructions; an older CPU dies on it" >&2
    exit 1
  fi
done
echo "bundle: libllama, libggml, libggml-base and the x64 CPU library hold no AVX/AVX-512"
cp "$ROOT/installer/linux/arbor.desktop" "$ROOT/resources/arbor.svg" "$APP/"

TARBALL="$OUT/arbor-$VERSION-linux-$ARCH.tar.gz"
tar -C "$OUT/dist" -czf "$TARBALL" Arbor

STAGE="$OUT/deb/arbor_${VERSION}_$ARCH"
mkdir -p "$STAGE/DEBIAN" "$STAGE/opt" "$STAGE/usr/bin" "$STAGE/usr/share/applications" \
  "$STAGE/usr/share/icons/hicolor/scalable/apps"
cp -a "$APP" "$STAGE/opt/arbor"
ln -s ../../opt/arbor/arbor "$STAGE/usr/bin/arbor"
cp "$ROOT/installer/linux/arbor.desktop" "$STAGE/usr/share/applications/"
cp "$ROOT/resources/arbor.svg" "$STAGE/usr/share/icons/hicolor/scalable/apps/"
cat > "$STAGE/DEBIAN/control" <<CONTROL
Package: arbor
Version: $VERSION
Architecture: $ARCH
Maintainer: Arbor developers <arbor@localhost>
Depends: $DEPENDS
Section: utils
Priority: optional
Description: Desktop chat for local language models, every conversation a tree
 Arbor runs GGUF models with llama.cpp. Edits, regenerations and branch switches restore
 the nearest saved engine state and decode only the tail; the reply is the one a full
 reprocess gives.
CONTROL
DEB="$OUT/arbor_${VERSION}_$ARCH.deb"
dpkg-deb --root-owner-group -Zgzip --build "$STAGE" "$DEB" >/dev/null

# The .deb, unpacked into a scratch root, checks itself; anything on stderr is a failure too.
dpkg-deb -x "$DEB" "$OUT/scratch"
QT_QPA_PLATFORM=offscreen "$OUT/scratch/opt/arbor/arbor" --self-test 2> "$OUT/self-test.stderr"
if [ -s "$OUT/self-test.stderr" ]; then
  echo "build_linux: the frozen self-test wrote to stderr:" >&2
  head -n 40 "$OUT/self-test.stderr" >&2
  exit 1
fi

# The bundle's llama.cpp in the frozen program's own process (`arbor --kernels`: the bundled
# model, the canary batch, a 64-token prompt and 8 tokens), natively: it names its CPU library.
native=$(ARBOR_HOME="$OUT/scratch/home" "$OUT/scratch/opt/arbor/arbor" --kernels --prompt 64 \
  --generate 8 2> "$OUT/kernels-native.stderr") || {
  echo "build_linux: the frozen arbor --kernels failed:" >&2
  tail -n 20 "$OUT/kernels-native.stderr" >&2
  exit 1
}
field() { "$PY" -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
echo "bundle: the frozen program's llama.cpp here: CPU library $(printf '%s' "$native" \
  | field cpu_variant), $(printf '%s' "$native" | field prompt_tok_s) prompt tok/s"

# The same libraries on CPUs without AVX-512 and without AVX: qemu-user emulates only the
# process it starts, and the frozen program restarts itself (PyInstaller's bootloader) and
# spawns its engine, so one Python process loads the bundle's own libraries
# (LLAMA_CPP_LIB_PATH) and decodes the bundled model under an emulated Haswell (AVX2) and
# Nehalem (SSE4.2); each must choose its library and decode.
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
  echo "build_linux: qemu-x86_64 (Debian's qemu-user) is needed to check the bundle on an" \
       "older CPU: apt-get install qemu-user" >&2
  exit 1
fi
BUNDLE_LIB="$OUT/scratch/opt/arbor/_internal/llama_cpp/lib"
for cpu in Haswell:haswell Nehalem:sse42; do
  name=${cpu%%:*}
  started=$(date +%s)
  if ! report=$(cd "$ROOT" && LLAMA_CPP_LIB_PATH="$BUNDLE_LIB" ARBOR_HOME="$OUT/scratch/home" \
      qemu-x86_64 -cpu "$name" "$PY" -m engine kernels --prompt 64 --generate 8 \
      2> "$OUT/kernels-$name.stderr"); then
    echo "build_linux: the bundle's llama.cpp failed under an emulated $name CPU:" >&2
    grep -v "TCG doesn't support" "$OUT/kernels-$name.stderr" | tail -n 20 >&2
    exit 1
  fi
  chose=$(printf '%s' "$report" | field cpu_variant)
  from=$(printf '%s' "$report" | field library_dir)
  if [ "$chose" != "${cpu##*:}" ] || [ "$from" != "$BUNDLE_LIB" ]; then
    echo "build_linux: under an emulated $name CPU llama.cpp chose $chose from $from," \
         "not ${cpu##*:} from the bundle" >&2
    exit 1
  fi
  echo "bundle: under qemu-x86_64 -cpu $name: CPU library $chose, the bundled model" \
       "decoded ($(printf '%s' "$report" | field prompt_tok_s) prompt tok/s emulated," \
       "$(( $(date +%s) - started )) s in all)"
done
echo "bundle: $(du -sh "$APP" | cut -f1) folder, $(du -h "$TARBALL" | cut -f1) $(basename "$TARBALL"), $(du -h "$DEB" | cut -f1) $(basename "$DEB")"
