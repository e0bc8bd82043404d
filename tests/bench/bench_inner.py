"""Benchmark: checkpoints inside long messages (`plan_inner`), on and off, interleaved.

The benchmark's conversation (`engine.bench.cases`: four long user turns, 16-token replies),
then its first case: the last user message edited in its middle. Per model and round, once
with inner checkpoints and once without (INNER_MOST = 0), in alternating order:

- the last send, which decodes the long last message and takes its inner checkpoints: how
  many, their bytes in RAM, every capture its prepare made (count and time), and the
  prepare's time;
- the edit: tokens decoded and the time to the first token.

    .venv/bin/python -m tests.bench.bench_inner --models gemma,hybrid --rounds 2

On a sliding-window model every inner chunk end is saved and loaded back anyway (settled:
engine.llm.runtime), so its captures are the same with inner checkpoints on or off: an inner
checkpoint keeps that blob instead of freeing it, and the next save then writes into fresh
memory.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import engine.llm.generator as generator_module
from engine.bench.cases import TURNS, Conversation
from engine.bench.models import BenchModel, Tokens, find
from engine.config.params import CacheMode, CheckpointOptions
from engine.llm.llama import ContextParams
from engine.llm.runtime import Runtime, RuntimeSettings
from engine.service.replay import replay
from engine.service.scenario import parse_scenario
from engine.storage.checkpoints import Checkpoint, CheckpointStore


@dataclass
class Run:
    inner: bool
    count: int  # inner checkpoints the last send kept
    ram_bytes: int  # their bytes
    captures: int  # every capture of the last send's prepare (settles included)
    capture_ms: float  # their time
    send_prepare_ms: float  # the last send's prepare
    edit_decoded: int
    edit_ttft_ms: float


@contextlib.contextmanager
def instrumented() -> Iterator[tuple[list[tuple[int, float]], list[Checkpoint]]]:
    """Every capture (tokens, ms) and every inner checkpoint kept, while inside."""
    captures: list[tuple[int, float]] = []
    kept: list[Checkpoint] = []
    capture, add = Runtime.capture, CheckpointStore.add

    def timed(self: Runtime, node_id: int | None = None) -> Checkpoint:
        started = time.perf_counter()
        checkpoint = capture(self, node_id)
        captures.append((checkpoint.n_tokens, (time.perf_counter() - started) * 1000))
        return checkpoint

    def recorded(self: CheckpointStore, checkpoint: Checkpoint, *, inner: bool = False) -> None:
        if inner:
            kept.append(checkpoint)
        add(self, checkpoint, inner=inner)

    Runtime.capture = timed  # type: ignore[method-assign]
    CheckpointStore.add = recorded  # type: ignore[method-assign]
    try:
        yield captures, kept
    finally:
        Runtime.capture = capture  # type: ignore[method-assign]
        CheckpointStore.add = add  # type: ignore[method-assign]


def one_run(model: BenchModel, conversation: Conversation, *, inner: bool,
            n_threads: int, n_ctx: int = 4608) -> Run:
    data = conversation.scenario(str(model.path), n_ctx=n_ctx, n_batch=512)
    data["steps"] = data["steps"][: TURNS + 1]  # the sends, then the edit in the middle
    settings = RuntimeSettings(n_ctx=n_ctx, n_batch=512, n_threads=n_threads,
                               context=replace(ContextParams(), swa_full=model.swa_full))
    most = generator_module.INNER_MOST
    generator_module.INNER_MOST = most if inner else 0
    try:
        with tempfile.TemporaryDirectory(prefix="arbor-bench-inner-") as disk, \
                instrumented() as (captures, kept):
            # Where the records stood after each step: the last send's are its own.
            marks: list[tuple[int, int]] = []
            report = replay(parse_scenario(data), cache=CacheMode.CHECKPOINTS,
                            runtime_settings=settings,
                            checkpoints=CheckpointOptions(disk_dir=Path(disk)),
                            on_step=lambda _i, _s: marks.append((len(captures), len(kept))))
    finally:
        generator_module.INNER_MOST = most
    steps: list[dict[str, Any]] = report["steps"]
    last_send, edit = steps[TURNS - 1], steps[TURNS]
    (c0, k0), (c1, k1) = marks[TURNS - 2], marks[TURNS - 1]
    sent = kept[k0:k1]
    return Run(
        inner=inner,
        count=len(sent),
        ram_bytes=sum(c.size for c in sent),
        captures=c1 - c0,
        capture_ms=sum(ms for _, ms in captures[c0:c1]),
        send_prepare_ms=float(last_send["prefill_ms"]),
        edit_decoded=int(edit["decoded_tokens"]),
        edit_ttft_ms=float(edit["ttft_ms"]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gemma,hybrid")
    parser.add_argument("--length", type=int, default=3500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=Path("bench-out/models"),
                        help="where the random models are (made there if absent)")
    args = parser.parse_args()
    for name in args.models.split(","):
        model = find(name, args.cache)
        tokens = Tokens(model.path)
        try:
            conversation = Conversation.of_length(args.length, tokens.per_word())
        finally:
            tokens.close()
        runs: list[Run] = []
        for k in range(args.rounds):
            for inner in ((True, False) if k % 2 == 0 else (False, True)):
                runs.append(one_run(model, conversation, inner=inner, n_threads=args.threads,
                                    n_ctx=max(4608, args.length * 5 // 4 + 256)))
                print(model.title, runs[-1], flush=True)
        for inner in (True, False):
            mine = [r for r in runs if r.inner is inner]
            print(f"{model.title}, inner {'on' if inner else 'off'}: "
                  f"{mine[0].count} inner checkpoints, "
                  f"{mine[0].ram_bytes / 2**20:.1f} MiB "
                  f"({mine[0].ram_bytes / max(1, mine[0].count) / 2**20:.2f} MiB each), "
                  f"{mine[0].captures} captures in "
                  f"{statistics.median(r.capture_ms for r in mine):.0f} ms, "
                  f"last send's prepare {statistics.median(r.send_prepare_ms for r in mine):.0f}"
                  f" ms; edit: {mine[0].edit_decoded} tokens decoded, time to first token "
                  f"{statistics.median(r.edit_ttft_ms for r in mine):.0f} ms "
                  f"({', '.join(f'{r.edit_ttft_ms:.0f}' for r in mine)})", flush=True)


if __name__ == "__main__":
    main()
