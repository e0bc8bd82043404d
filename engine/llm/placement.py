"""Where a model runs: the CPU's kernels, any GPU and RPC workers, and how many layers each
takes. `place()` decides before a load, from the settings and this machine; the runtime
(engine.llm.runtime) loads accordingly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine.config.endpoints import parse_endpoints
from engine.config.params import GPU_LAYERS_FIT, ContextParams, FlashAttention, RuntimeSettings
from engine.llm.llama import (
    GpuFit,
    fit_gpu_layers,
    gpu_backend_name,
    gpu_description,
    native_backends,
    supports_gpu_offload,
)
from engine.llm.repack import Decision, RepackGuard
from engine.llm.rpc import WorkersUnreachable, unreachable

log = logging.getLogger(__name__)


@dataclass
class Placement:
    model: Path
    workers: tuple[str, ...]  # RPC workers, probed
    context: ContextParams  # as asked, with what the workers need
    n_gpu_layers: int  # -1: every layer; 0: the CPU (before any fit)
    fitting: bool  # llama.cpp's fit decides the GPU layers (`fit_layers`)
    gpu: str | None  # the GPU backend in use
    backend: str  # in words, for the status bar: "CPU", "CUDA (NVIDIA ...) + 1 RPC worker"
    devices: str  # what a checkpoint's identity records: "cpu", "cuda,rpc:host:port"
    guard: RepackGuard  # the marker of the load's risky window (engine.llm.repack)
    repack: bool  # weight repacking for the CPU kernels
    kernels: str  # the CPU library, and "no repacking" where so
    notices: list[str] = field(default_factory=list)  # what the user is told

    def fit_layers(self) -> GpuFit | None:
        """llama.cpp's fit of the layers to the GPU's free memory (every layer if this build
        cannot fit), said in the notices when not all fit."""
        fit = fit_gpu_layers(self.model, self.context, repack=self.repack)
        if fit is None:
            log.warning("llama.cpp's fit is not in this build: every layer goes to the GPU")
            return None
        log.info("llama.cpp's fit: %d GPU layers%s", fit.n_gpu_layers,
                 "" if fit.ok else " (projected not to fit even so)")
        if not fit.ok:
            self.notices.append(f"the model is projected not to fit this GPU's free memory "
                                f"even with {fit.n_gpu_layers} layers on it")
        return fit


def place(model: Path, settings: RuntimeSettings, repack: bool | None = None) -> Placement:
    """Where `model` runs under `settings`. `repack`: False loads without weight repacking;
    None lets engine.llm.repack decide. Raises WorkersUnreachable before llama.cpp would abort
    on a worker that does not answer, or wait for ever on one that never ends its
    handshake (engine.llm.rpc.probe)."""
    notices: list[str] = []
    endpoints = parse_endpoints(settings.rpc_workers)
    workers = tuple(str(e) for e in endpoints)
    gone = unreachable(endpoints)
    if gone:  # llama.cpp would abort the process, or hang, on registering one of these
        raise WorkersUnreachable(gone)
    n_gpu_layers = settings.n_gpu_layers
    context = settings.context_params()
    fitting = n_gpu_layers == GPU_LAYERS_FIT
    if workers:
        if n_gpu_layers in (0, GPU_LAYERS_FIT):
            n_gpu_layers, fitting = -1, False  # the workers are there to take the layers
        if context.flash_attn is not FlashAttention.ON:
            # Without it a state save over RPC is thousands of round trips, with it about
            # 60 (docs/architecture.md, "llama.cpp facts the code relies on").
            context = replace(context, flash_attn=FlashAttention.ON)
            notices.append("flash attention is on: RPC workers need it")
    gpu = gpu_backend_name() if n_gpu_layers != 0 and supports_gpu_offload() else None
    if fitting and gpu is None:
        n_gpu_layers, fitting = 0, False  # no GPU here: the CPU, as asked
    if n_gpu_layers != 0 and gpu is None and not workers:
        message = ("GPU offload was requested but this llama.cpp build has no GPU backend; "
                   "running on the CPU")
        log.warning(message)
        notices.append(message)
        n_gpu_layers = 0
    backend = gpu or "CPU"
    if gpu is not None:
        backend += f" ({gpu_description() or 'GPU'})"  # the status bar names it
    if workers:
        backend += f" + {len(workers)} RPC worker{'s' if len(workers) > 1 else ''}"
    native = native_backends()
    guard = RepackGuard(model, native)
    decision = guard.decide() if repack is not False else Decision(False)
    if decision.notice is not None:
        log.warning("%s", decision.notice)
        notices.append(decision.notice)
    return Placement(
        model=model, workers=workers, context=context, n_gpu_layers=n_gpu_layers,
        fitting=fitting, gpu=gpu, backend=backend,
        devices=",".join([(gpu or "cpu").lower(), *(f"rpc:{w}" for w in workers)]),
        guard=guard, repack=decision.repack,
        kernels=native.cpu_variant if decision.repack else
        f"{native.cpu_variant}, no repacking",
        notices=notices)
