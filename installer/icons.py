"""Render resources/arbor.svg into the icon files the bundles need.

    python installer/icons.py OUT_DIR

Writes arbor-<size>.png (16..1024), arbor.ico (Windows) and arbor.iconset/ (macOS: turn it
into arbor.icns with `iconutil -c icns`). Qt draws the SVG, so nothing else is needed."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QGuiApplication, QImage, QImageWriter, QPainter
from PySide6.QtSvg import QSvgRenderer

SVG = Path(__file__).resolve().parents[1] / "resources" / "arbor.svg"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512, 1024)


def render(renderer: QSvgRenderer, size: int) -> QImage:
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    renderer.render(painter, QRectF(0, 0, size, size))
    painter.end()
    return image


def main(out: Path) -> int:
    QGuiApplication.instance() or QGuiApplication(["icons", "-platform", "offscreen"])
    renderer = QSvgRenderer(str(SVG))
    out.mkdir(parents=True, exist_ok=True)
    iconset = out / "arbor.iconset"
    iconset.mkdir(exist_ok=True)
    images = {size: render(renderer, size) for size in SIZES}
    for size, image in images.items():
        image.save(str(out / f"arbor-{size}.png"))
    for size in (16, 32, 128, 256, 512):  # macOS names: 1x and 2x of each
        images[size].save(str(iconset / f"icon_{size}x{size}.png"))
        images[size * 2].save(str(iconset / f"icon_{size}x{size}@2x.png"))
    writer = QImageWriter(str(out / "arbor.ico"), b"ico")
    if not writer.write(images[256]):
        sys.stderr.write(f"icons: cannot write arbor.ico ({writer.errorString()})\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
