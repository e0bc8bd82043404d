#!/usr/bin/env bash
# Which llama.cpp backend `make` builds on this machine: metal on macOS; cuda where the CUDA
# toolkit (nvcc) and an NVIDIA GPU are both here; vulkan where its SDK (glslc and the headers)
# and a Vulkan GPU are; else cpu. `make GPU=cpu|cuda|vulkan` overrides.
#
# A toolkit without a GPU builds for the CPU, and says so: a CUDA build takes an hour on a
# small machine and nothing here could run it (CI machines and containers often have nvcc).
set -u
say() { echo "make: $*" >&2; }
if [ "$(uname -s)" = "Darwin" ]; then echo metal; exit 0; fi

nvcc_found() {
  command -v nvcc >/dev/null 2>&1 || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] \
    || [ -x /usr/local/cuda/bin/nvcc ]
}
nvidia_gpu() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    return 0
  fi
  ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1
}
vulkan_sdk() {
  command -v glslc >/dev/null 2>&1 && { [ -n "${VULKAN_SDK:-}" ] || \
    [ -f /usr/include/vulkan/vulkan.h ]; }
}
vulkan_gpu() {
  command -v vulkaninfo >/dev/null 2>&1 && vulkaninfo --summary 2>/dev/null \
    | grep -q 'PHYSICAL_DEVICE_TYPE_\(DISCRETE\|INTEGRATED\)_GPU'
}

if nvcc_found; then
  if nvidia_gpu; then echo cuda; exit 0; fi
  say "the CUDA toolkit is here but no NVIDIA GPU: building for the CPU (make GPU=cuda forces it)"
fi
if vulkan_sdk; then
  if vulkan_gpu; then echo vulkan; exit 0; fi
  say "the Vulkan SDK is here but no Vulkan GPU: building for the CPU (make GPU=vulkan forces it)"
fi
echo cpu
