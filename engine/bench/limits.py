"""The engine's limits, measured: checkpoint throughput against a plain copy, the checkpoint
store against its budgets over a long branching session, and thread counts quiet and busy."""

from __future__ import annotations

import logging
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.bench.cases import PASSAGE, REPLY_TOKENS, SYSTEM, paragraph
from engine.bench.models import BenchModel
from engine.config.params import CheckpointOptions, ContextParams, RuntimeSettings, SamplingParams
from engine.llm.llama import LlamaContext, LlamaModel
from engine.llm.runtime import Runtime
from engine.service.replay import CacheMode, replay
from engine.service.scenario import parse_scenario

log = logging.getLogger(__name__)

TAIL = 64  # the tokens decoded after a restore in the "switch" figure


def _median_ms(run: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


@dataclass(frozen=True)
class Throughput:
    model: str
    tokens: int
    bytes: int
    capture_ms: float
    restore_ms: float
    copy_ms: float  # the same bytes into a preallocated buffer: the bandwidth limit
    prefill_ms: float  # the same tokens decoded from scratch: what a restore saves
    tail_ms: float  # restore, then TAIL more tokens: a branch switch's prompt cost
    reply_ms: float  # prefill plus REPLY_TOKENS generated: a full reply's time

    @property
    def capture_mb_s(self) -> float:
        return self.bytes / 1e6 / max(self.capture_ms / 1000, 1e-9)

    @property
    def restore_mb_s(self) -> float:
        return self.bytes / 1e6 / max(self.restore_ms / 1000, 1e-9)

    @property
    def copy_mb_s(self) -> float:
        return self.bytes / 1e6 / max(self.copy_ms / 1000, 1e-9)

    @property
    def capture_share(self) -> float:
        """The prompt-end capture as a share of a full reply's time."""
        return self.capture_ms / max(self.reply_ms, 1e-9)


def checkpoint_throughput(model: BenchModel, *, tokens: int, n_threads: int,
                          rounds: int = 5) -> Throughput:
    """Capture and restore a `tokens`-token state through the runtime, against numpy copying
    the same bytes into a buffer allocated beforehand."""
    settings = RuntimeSettings(n_ctx=max(4096, tokens + 2 * TAIL), n_batch=512,
                               n_threads=n_threads,
                               context=ContextParams(swa_full=model.swa_full))
    runtime = Runtime(model.path, settings)
    try:
        words = paragraph(tokens, 0)
        target = runtime.model.tokenize(words)[:tokens]
        tail = runtime.model.tokenize(" " + paragraph(TAIL, 3))[:TAIL]

        def prefill() -> None:
            runtime.clear()
            runtime.prepare(target)

        prefill_ms = _median_ms(prefill, max(1, rounds // 2))
        checkpoint = runtime.capture()
        capture_ms = _median_ms(runtime.capture, rounds)
        size = len(checkpoint.blob or b"")
        restore_ms = _median_ms(lambda: runtime.restore(checkpoint), rounds)
        source = np.frombuffer(bytes(checkpoint.blob or b""), dtype=np.uint8)
        buffer = np.empty_like(source)
        copy_ms = _median_ms(lambda: np.copyto(buffer, source), rounds)

        def switch() -> None:
            runtime.restore(checkpoint)
            runtime.prepare([*target, *tail])

        tail_ms = _median_ms(switch, rounds)

        def reply() -> None:
            prefill()
            runtime.generate(max_tokens=REPLY_TOKENS, sampling=SamplingParams(temperature=0.0),
                             seed=0)

        reply_ms = _median_ms(reply, max(1, rounds // 2))
    finally:
        runtime.close()
    return Throughput(model.title, len(target), size, capture_ms, restore_ms, copy_ms,
                      prefill_ms, tail_ms, reply_ms)


def store_over_session(model: BenchModel, *, n_threads: int, branches: int,
                       ram_budget: int, disk_budget: int) -> dict[str, Any]:
    """A long session with many branches (edits all over a conversation, each followed by a
    switch back, and regenerates) under small budgets: the store's RAM and disk use after
    every step, against them."""
    steps: list[dict[str, Any]] = [
        {"op": "send", "text": f"Note {k}: {paragraph(120, k * 5)}", "max_tokens": REPLY_TOKENS}
        for k in range(6)
    ]
    for k in range(branches):
        if k % 3 == 2:
            steps.append({"op": "regenerate", "max_tokens": REPLY_TOKENS})
            continue
        message = 2 * (k % 6)  # a user message, walking over the conversation
        steps += [{"op": "edit", "message": message, "max_tokens": REPLY_TOKENS,
                   "text": f"Note {k} again: {paragraph(100, k * 3)}"},
                  {"op": "switch", "message": message, "variant": 0}]  # back again
    data = {"model": str(model.path), "n_ctx": 4096, "n_batch": 512, "seed": 0,
            "sampling": {"temperature": 0.0}, "system": SYSTEM, "steps": steps}
    trace: list[dict[str, Any]] = []

    def record(index: int, stats: dict[str, Any] | None) -> None:
        if stats is not None:
            trace.append({"step": index, **{k: stats[k] for k in (
                "count", "ram_bytes", "disk_bytes", "ram_budget", "disk_budget", "created",
                "restored", "rejected")}})

    with tempfile.TemporaryDirectory(prefix="arbor-bench-store-") as disk:
        report = replay(
            parse_scenario(data), cache=CacheMode.CHECKPOINTS,
            runtime_settings=RuntimeSettings(n_ctx=4096, n_batch=512, n_threads=n_threads,
                                             context=ContextParams(swa_full=model.swa_full)),
            checkpoints=CheckpointOptions(ram_budget=ram_budget, disk_dir=Path(disk),
                                          disk_budget=disk_budget),
            on_step=record)
    decoded = [s["decoded_tokens"] or 0 for s in report["steps"][6:]]
    return {
        "model": model.title, "steps": len(steps), "branches": branches,
        "ram_budget": ram_budget, "disk_budget": disk_budget,
        "peak_ram_bytes": max((t["ram_bytes"] for t in trace), default=0),
        "peak_disk_bytes": max((t["disk_bytes"] for t in trace), default=0),
        "final": trace[-1] if trace else None,
        "branch_decoded_median": statistics.median(decoded) if decoded else None,
        "trace": trace,
    }


@contextmanager
def busy_neighbour() -> Iterator[None]:
    """One other process keeping a core busy, as a desktop always has something running."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        yield
    finally:
        spinner.kill()
        spinner.wait()


@dataclass(frozen=True)
class ThreadFigure:
    threads: int
    busy: bool
    prefill_tok_s: float
    generate_tok_s: float


def thread_speeds(path: Path, counts: list[int], *, prompt: int = 512, generate: int = 32,
                  rounds: int = 3) -> list[ThreadFigure]:
    """Prompt and generation speed for each thread count, quiet and beside a busy process,
    interleaved (each count once per round)."""
    model = LlamaModel(path)
    try:
        tokens = model.tokenize(" ".join([PASSAGE] * 20))[:prompt]
        contexts = {n: LlamaContext(model, ContextParams(n_ctx=2048, n_batch=512, n_threads=n))
                    for n in counts}
        figures = []
        try:
            for busy in (False, True):
                samples: dict[int, tuple[list[float], list[float]]] = {
                    n: ([], []) for n in counts}
                with busy_neighbour() if busy else nullcontext():
                    for _ in range(rounds):
                        for n, ctx in contexts.items():
                            prefill, gen = _speed(ctx, tokens, generate)
                            samples[n][0].append(prefill)
                            samples[n][1].append(gen)
                figures += [ThreadFigure(n, busy, statistics.median(p), statistics.median(g))
                            for n, (p, g) in samples.items()]
        finally:
            for ctx in contexts.values():
                ctx.close()
    finally:
        model.close()
    return figures


def _speed(ctx: LlamaContext, tokens: list[int], generate: int) -> tuple[float, float]:
    ctx.clear()
    started = time.perf_counter()
    ctx.decode(tokens, 0)
    prefill = len(tokens) / (time.perf_counter() - started)
    started = time.perf_counter()
    for i in range(generate):
        ctx.decode([tokens[i % len(tokens)]], len(tokens) + i)
    return prefill, generate / (time.perf_counter() - started)
