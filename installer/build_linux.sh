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
# What Qt's X11 plugin loads that a desktop may lack (see app/system_check.py).
DEPENDS="libxcb-cursor0, libxcb-icccm4, libxcb-keysyms1, libxcb-image0, libxcb-render-util0, \
libxcb-randr0, libxcb-shape0, libxcb-xkb1, libxkbcommon-x11-0, libegl1, libfontconfig1, \
libdbus-1-3"

"$PY" -m pip install --quiet "pyinstaller>=6.10"
rm -rf "$OUT/dist" "$OUT/work" "$OUT/deb" "$OUT/scratch"
"$PY" -m PyInstaller --noconfirm --log-level WARN --distpath "$OUT/dist" \
  --workpath "$OUT/work" "$ROOT/installer/arbor.spec"
APP="$OUT/dist/Arbor"
if ! ls "$APP"/_internal/llama_cpp/lib/libllama.* >/dev/null 2>&1; then
  echo "build_linux: llama.cpp's libraries are missing from the bundle" >&2
  exit 1
fi
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
echo "bundle: $(du -sh "$APP" | cut -f1) folder, $(du -h "$TARBALL" | cut -f1) $(basename "$TARBALL"), $(du -h "$DEB" | cut -f1) $(basename "$DEB")"
