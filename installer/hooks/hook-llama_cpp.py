"""PyInstaller hook: llama.cpp's shared libraries, kept at llama_cpp/lib (llama-cpp-python
loads them from beside its own module). No library collected is a build error."""

from pathlib import Path

from PyInstaller.utils.hooks import get_package_paths

_, package = get_package_paths("llama_cpp")
libraries = sorted(p for p in (Path(package) / "lib").iterdir() if ".so" in p.name
                   or p.suffix in (".dylib", ".dll"))
if not libraries:
    raise SystemExit(f"hook-llama_cpp: no shared library in {package}/lib")
# llama.cpp's common library (its GPU fit, engine/llm/llama.py), which llama-cpp-python's build
# installs in the wheel's top-level lib/: beside the others in the bundle.
common = sorted((Path(package).parent / "lib").glob("libllama-common.*"))
binaries = [(str(p), "llama_cpp/lib") for p in [*libraries, *common]]
