"""Benchmark: where a request's milliseconds go, at 1k, 4k and 16k tokens of conversation.

Grows one conversation on a real model in process (the window's engine, without the process
boundary) and, at each length, sends a few short messages. Each send's wall time is split
into llama.cpp's own work (every `llama_decode`, every sampling call, every state save and
load, timed at the ctypes call) and the rest, Arbor's Python: rendering, matching,
tokenizing, checkpoint bookkeeping, streaming, store writes. The rest should not grow with
the conversation. With --profile, the top functions by own time at the longest length.

    flock /tmp/arbor-model.lock .venv/bin/python -m tests.bench.bench_overhead \
        [--model smollm2|gemma|mamba|hybrid|PATH.gguf] [--lengths 1000 4000 16000] \
        [--threads 1] [--profile] [--calls]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.bench.cases import paragraph
from engine.bench.models import find
from engine.config.params import ContextParams, FlashAttention, RuntimeSettings
from engine.llm import llama
from engine.llm.runtime import Runtime
from engine.service.session import GenerationOptions, Session
from engine.storage.checkpoints import CheckpointStore
from engine.storage.keyfile import installation_key

NATIVE = {  # (class, method): what the time is
    (llama.LlamaContext, "decode"): "decode",
    (llama.LlamaContext, "state_get"): "state",
    (llama.LlamaContext, "state_set"): "state",
    (llama.Sampler, "sample"): "sample",
}
GROW_WORDS = 240  # a long user turn while the conversation grows
PROBE_WORDS = 50  # the measured sends: a short message (~65 tokens)
PROBE_REPLY = 32


@dataclass
class Split:
    length: int
    wall_ms: float
    ttft_ms: float
    native_before_first_ms: float  # llama.cpp's time before the first token
    native_ms: dict[str, float]
    generated: int

    @property
    def prepare_overhead_ms(self) -> float:
        return self.ttft_ms - self.native_before_first_ms

    @property
    def per_token_overhead_ms(self) -> float:
        after = self.wall_ms - self.ttft_ms
        native_after = sum(self.native_ms.values()) - self.native_before_first_ms
        return (after - native_after) / max(1, self.generated - 1)


class Clock:
    """Wall time inside llama.cpp's calls, by kind, since the last `reset`."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.first_token_at: float | None = None
        self.native_at_first = 0.0
        self.calls: list[tuple[str, int, float]] = []  # kind, tokens decoded, ms

    def reset(self) -> None:
        self.spent = defaultdict(float)
        self.first_token_at = None
        self.native_at_first = 0.0
        self.calls = []

    @contextmanager
    def installed(self) -> Iterator[None]:
        saved: list[tuple[type, str, Callable[..., Any]]] = []
        for (owner, name), kind in NATIVE.items():
            original = getattr(owner, name)
            saved.append((owner, name, original))
            setattr(owner, name, self._timed(original, kind))
        try:
            yield
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)

    def _timed(self, original: Callable[..., Any], kind: str) -> Callable[..., Any]:
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                ended = time.perf_counter()
                clock.spent[kind] += (ended - started) * 1000.0
                tokens = len(args[1]) if kind == "decode" and len(args) > 1 else 0
                clock.calls.append((kind, tokens, (ended - started) * 1000.0))
                if kind == "sample" and clock.first_token_at is None:
                    clock.first_token_at = ended
                    clock.native_at_first = sum(clock.spent.values())

        return timed


@contextmanager
def every_thread(on: bool) -> Iterator[list[cProfile.Profile]]:
    """cProfile in this thread and in every thread started inside (the engine's runs a
    request on a thread of its own); the profilers, stopped, after."""
    profilers: list[cProfile.Profile] = []
    if not on:
        yield profilers
        return

    def start(*_: object) -> None:  # the first event of a new thread
        sys.setprofile(None)
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.enable()

    main = cProfile.Profile()
    threading.setprofile(start)
    main.enable()
    try:
        yield profilers
    finally:
        main.disable()
        threading.setprofile(None)
        for profiler in profilers:
            profiler.disable()
        profilers.append(main)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--probes", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--probe-words", type=int, default=PROBE_WORDS,
                        help="the measured messages' length in words (240: a new turn of "
                             "the API session)")
    parser.add_argument("--calls", action="store_true",
                        help="list the last probe's first native calls (decodes with their "
                             "token counts, state saves and loads) at each length")
    parser.add_argument("--flash-attn", choices=[f.value for f in FlashAttention],
                        default=FlashAttention.OFF.value)
    args = parser.parse_args()
    path = find(args.model, Path(tempfile.gettempdir()) / "arbor-bench-models").path
    n_ctx = max(args.lengths) + 2048
    runtime = Runtime(path, RuntimeSettings(
        n_ctx=n_ctx, n_batch=512, n_threads=args.threads,
        context=ContextParams(flash_attn=FlashAttention(args.flash_attn))))
    store = CheckpointStore(runtime.identity(), key=installation_key())
    session = Session(runtime, checkpoints=store)
    clock = Clock()
    rows: list[Split] = []
    profile_text = ""
    turn = 0
    try:
        with clock.installed():
            for length in sorted(args.lengths):
                while True:
                    report = session.send(f"Go on, turn {turn}: {paragraph(GROW_WORDS, turn)}",
                                          GenerationOptions(max_tokens=8)).report
                    turn += 1
                    assert report is not None
                    if report.prompt_tokens >= length:
                        break
                for probe in range(args.probes):
                    profiling = args.profile and length == max(args.lengths) and \
                        probe == args.probes - 1
                    clock.reset()
                    started = time.perf_counter()
                    with every_thread(profiling) as profilers:
                        text = f"And then, {turn}? {paragraph(args.probe_words, turn)}"
                        step = session.send(text, GenerationOptions(max_tokens=PROBE_REPLY))
                    if args.calls and probe == args.probes - 1:
                        before = [c for c in clock.calls if c[0] != "sample"][:24]
                        print("    native calls: " + ", ".join(
                            f"{kind} {n} {ms:.0f} ms" if n else f"{kind} {ms:.0f} ms"
                            for kind, n, ms in before), flush=True)
                    if profilers:
                        out = io.StringIO()
                        pstats.Stats(*profilers, stream=out).sort_stats("tottime") \
                            .print_stats(25)
                        profile_text = out.getvalue()
                    wall = (time.perf_counter() - started) * 1000.0
                    turn += 1
                    assert step.report is not None and clock.first_token_at is not None
                    ttft = (clock.first_token_at - started) * 1000.0
                    rows.append(Split(step.report.prompt_tokens, wall, ttft,
                                      clock.native_at_first, dict(clock.spent),
                                      step.report.generated_tokens))
                    print(f"{step.report.prompt_tokens:>6} tokens: {step.report.describe()}",
                          flush=True)
    finally:
        runtime.close()
    print("\n| prompt tokens | to first token | llama.cpp before it | Arbor before it | "
          "per generated token: Arbor | decode | sample | state save/load |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.length:,} | {r.ttft_ms:.1f} ms | {r.native_before_first_ms:.1f} ms | "
              f"{r.prepare_overhead_ms:.1f} ms | {r.per_token_overhead_ms:.2f} ms | "
              f"{r.native_ms.get('decode', 0):.1f} ms | {r.native_ms.get('sample', 0):.1f} ms | "
              f"{r.native_ms.get('state', 0):.1f} ms |")
    if profile_text:
        print("\nTop functions by own time, last send at the longest length:\n")
        print(profile_text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
