"""Benchmark: how long the window's event loop stalls while the engine works.

The real main window on the bundled model, offscreen. One step: send a message that makes a
~2,000-token prompt and stream a 200-token reply. A 10 ms QTimer ticks on the GUI thread;
the gaps between its ticks are the time the window could not repaint or react. The engine
runs on a thread of the window's process (`ThreadEngine`, what Arbor did before) or in its own
process (`ProcessEngine`, what it does now); the two alternate, in one run.

    QT_QPA_PLATFORM=offscreen .venv/bin/python -m tests.bench.bench_stall [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# ~2,000 tokens with SmolLM2's tokenizer; the request makes it write all 200 tokens (a prompt
# of notes alone got a 38-token answer).
PROMPT = " ".join(f"Note {i}: the tide rises twice a day and the delta grows by silt."
                  for i in range(110)) + (
    "\n\nWrite a long story about a fisherman who lives on this delta.")


@dataclass
class Stalls:
    prefill: list[float] = field(default_factory=list)  # gaps before the first token (s)
    streaming: list[float] = field(default_factory=list)  # gaps while the reply streams
    prompt_tokens: int = 0
    generated: int = 0

    def line(self, name: str) -> str:
        def stats(gaps: list[float]) -> str:
            ordered = sorted(gaps)
            p99 = ordered[int(len(ordered) * 0.99)] if ordered else 0.0
            return f"longest {ordered[-1] * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"

        return (f"{name}: {self.prompt_tokens} prompt tokens, {self.generated} generated; "
                f"prefill {stats(self.prefill)}; streaming {stats(self.streaming)}")


def measure(kind: str, base: Path) -> Stalls:
    from PySide6.QtCore import QEventLoop, QTimer

    from app.state.engine_client import ProcessEngine, QtEngine, ThreadEngine
    from app.window.main_window import MainWindow
    from engine.config.settings import Settings
    from engine.models.files import default_model_path
    from engine.storage.store import Store

    engine: QtEngine = ThreadEngine() if kind == "thread" else ProcessEngine()
    settings = Settings(max_tokens=200, n_ctx=4096, seed=7)
    store = Store(Path(tempfile.mkdtemp(dir=base)) / "c.db")  # a fresh conversation each run
    window = MainWindow(store=store, settings=settings, engine=engine)
    window.show()
    loop = QEventLoop()
    window.model_ready.connect(loop.quit)
    window.models.load_model(str(default_model_path()))
    loop.exec()
    stalls = Stalls()
    first_piece = [0.0]
    last = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        (stalls.streaming if first_piece[0] else stalls.prefill).append(now - last[0])
        last[0] = now

    def on_piece() -> None:
        if not first_piece[0]:
            first_piece[0] = time.perf_counter()

    window.text_shown.connect(on_piece)
    window.replies.schedule_warm = lambda: None  # type: ignore[method-assign]  # one step only
    timer = QTimer()
    timer.timeout.connect(tick)
    timer.start(10)
    done = QEventLoop()
    window.reply_finished.connect(done.quit)
    last[0] = time.perf_counter()
    window.controller.send(PROMPT)
    done.exec()
    timer.stop()
    report = window.replies.last_reply
    assert report is not None
    stalls.prompt_tokens, stalls.generated = report.prompt_tokens, report.generated_tokens
    window.close()
    window.deleteLater()
    return stalls


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ARBOR_HOME"] = str(Path(tmp) / "home")
        from PySide6.QtWidgets import QApplication

        app = QApplication([])
        results: dict[str, list[Stalls]] = {"thread": [], "process": []}
        for round_ in range(args.rounds):
            for kind in ("thread", "process") if round_ % 2 == 0 else ("process", "thread"):
                stalls = measure(kind, Path(tmp))
                results[kind].append(stalls)
                print(stalls.line(f"round {round_ + 1}, engine in a {kind}"), flush=True)
        for kind, runs in results.items():
            worst_prefill = max(max(r.prefill) for r in runs) * 1000
            worst_stream = max(max(r.streaming) for r in runs) * 1000
            median_prefill = statistics.median(max(r.prefill) for r in runs) * 1000
            print(f"engine in a {kind}: longest gap while preparing {worst_prefill:.0f} ms "
                  f"(median of runs {median_prefill:.0f} ms), while streaming "
                  f"{worst_stream:.0f} ms")
        del app
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
