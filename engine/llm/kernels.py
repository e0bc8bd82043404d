"""`arbor-engine kernels` (and the bundle's `arbor --kernels`): which llama.cpp kernels run
on this machine, whether they work, and what weight repacking is worth here.

It loads a model in this very process, with no engine process beside it: run under an
emulated CPU (`qemu-x86_64 -cpu Haswell`), this process is the one that runs llama.cpp. A
load decodes the canary batch (engine.llm.runtime); the check then decodes a prompt in
prompt-sized chunks and generates tokens one at a time. With `rounds`, it times both with
weight repacking on and off, interleaved, and reports the medians and their ratio.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config.params import RuntimeSettings
from engine.llm.backends import library_dir
from engine.llm.cpu import cpu_flags, cpu_name, has_amx
from engine.llm.llama import native_backends
from engine.llm.runtime import Runtime

PROMPT_TOKENS = 512
GENERATED_TOKENS = 64


@dataclass(frozen=True)
class Speed:
    prompt_tok_s: float
    generate_tok_s: float


def _speed(model: Path, settings: RuntimeSettings, repack: bool | None, prompt: int,
           generated: int) -> tuple[Speed, Runtime]:
    runtime = Runtime(model, settings, repack=repack)
    ctx = runtime.ctx
    n_batch = ctx.params.n_batch
    tokens = [(1000 + 7 * i) % runtime.model.n_vocab for i in range(prompt + generated)]
    started = time.perf_counter()
    for start in range(0, prompt, n_batch):
        ctx.decode(tokens[start:min(prompt, start + n_batch)], start)
    prompted = time.perf_counter()
    for i in range(prompt, prompt + generated):
        ctx.decode([tokens[i]], i)
    ended = time.perf_counter()
    ctx.clear()
    return Speed(prompt / (prompted - started), generated / (ended - prompted)), runtime


def check(model: Path, *, rounds: int = 0, n_threads: int = 0, prompt: int = PROMPT_TOKENS,
          generated: int = GENERATED_TOKENS) -> dict[str, Any]:
    """What runs here and that it decodes; with `rounds`, repacking on against off."""
    native = native_backends()
    flags = cpu_flags()
    settings = RuntimeSettings(n_ctx=max(1024, prompt + generated + 64), n_threads=n_threads)
    speed, runtime = _speed(model, settings, None, prompt, generated)
    report: dict[str, Any] = {
        "cpu": cpu_name() or "unknown",
        # As the kernel lists them (/proc/cpuinfo); an emulator changes only what the CPU
        # libraries see, so `cpu_variant` and `cpu_features` are what ran.
        "cpuinfo_avx2": "avx2" in flags,
        "cpuinfo_avx512": "avx512f" in flags,
        "cpuinfo_amx": has_amx(flags),
        "portable_build": native.portable,
        "library_dir": str(library_dir()),
        "cpu_variant": native.cpu_variant,
        "cpu_features": {k: v for k, v in native.cpu_features.items() if v not in ("", "0")},
        "other_backends": list(native.loaded),
        "left_out": list(native.skipped),
        "model": model.name,
        "kernels": runtime.kernels,
        "repacking": runtime.repack,
        "prompt_tok_s": round(speed.prompt_tok_s, 1),
        "generate_tok_s": round(speed.generate_tok_s, 1),
    }
    runtime.close()
    if rounds <= 0 or not report["repacking"]:
        return report
    on: list[Speed] = []
    off: list[Speed] = []
    for _ in range(rounds):  # interleaved: a busy moment hits both sides
        for repack, into in ((None, on), (False, off)):
            measured, runtime = _speed(model, settings, repack, prompt, generated)
            runtime.close()
            into.append(measured)

    def median(speeds: list[Speed], attribute: str) -> float:
        return statistics.median(getattr(s, attribute) for s in speeds)

    for name in ("prompt_tok_s", "generate_tok_s"):
        with_, without = median(on, name), median(off, name)
        report[f"repack_on_{name}"] = round(with_, 1)
        report[f"repack_off_{name}"] = round(without, 1)
        report[f"repack_off_{name}_ratio"] = round(without / with_, 3)
    report["rounds"] = rounds
    return report
