"""Benchmark: the cost of branching on a ~1,500-token conversation, Arbor vs the alternatives.

For each model it replays one scenario three ways, in the same run:
  - `checkpoints`: Arbor (live cache + checkpoints),
  - `none`: Arbor with the cache cleared at every step (the full-reprocess reference),
  - `llama-cpp-python`: a plain app on `Llama.create_chat_completion(stream=True)`, which
    re-renders the messages and reuses the longest common prefix of its cache.
and reports, for "edit the last user message", "regenerate" and "switch back to the old
branch after an early edit, then send", the tokens decoded and the time to first token.

    .venv/bin/python -m tests.bench.bench_branching [--out BENCHMARKS.md] [--models smollm2,mamba]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.model import default_model_path
from engine.replay import CacheMode, replay
from engine.runtime import RuntimeSettings
from engine.scenario import parse_scenario
from engine.bench.random_models import write_realistic_mamba

log = logging.getLogger("bench")

PASSAGE = (
    "the river carries silt from the mountains to the delta where farmers plant rice in "
    "spring and harvest in autumn while herons wait in the shallows for fish and the old "
    "mill turns slowly beside the bridge that the village rebuilt after the flood"
)
WORDS = PASSAGE.split(" ")
SYSTEM = "You are a helpful assistant."
MAX_TOKENS = 16
THREADS = max(1, (os.cpu_count() or 2))


def _paragraph(n_words: int, offset: int) -> str:
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(n_words))


def scenario(model: str, *, warm: bool = False) -> dict[str, Any]:
    """Three long user turns (~1,500 tokens in all), then the three branching operations.
    With `warm`, a warm-up (what the app does while the user reads or types) comes before
    the third message and before the send after the switch; see WARMED for the indexes."""
    turns = [
        f"Summarise this passage in one line: {_paragraph(450, k * 7)}" for k in range(3)
    ]
    steps: list[dict[str, Any]] = [
        {"op": "send", "text": t, "max_tokens": MAX_TOKENS} for t in turns
    ]
    steps += [
        {"op": "edit", "message": 4, "text": turns[2] + " Be brief.", "max_tokens": MAX_TOKENS},
        {"op": "regenerate", "max_tokens": MAX_TOKENS},
        {"op": "edit", "message": 0, "text": "Tell me about rivers.", "max_tokens": MAX_TOKENS},
        {"op": "switch", "message": 0, "variant": 0},
        {"op": "send", "text": "Thanks. And the herons?", "max_tokens": MAX_TOKENS},
    ]
    if warm:
        steps.insert(7, {"op": "warm"})
        steps.insert(2, {"op": "warm"})
    return {
        "model": model, "n_ctx": 4096, "n_batch": 512, "seed": 42,
        "sampling": {"temperature": 0.0}, "system": SYSTEM, "steps": steps,
    }


MEASURED = {3: "edit the last user message", 4: "regenerate", 7: "switch back, then send"}
# The same sends in the warmed scenario: step index there -> index in MEASURED (or -1).
WARMED = {3: -1, 9: 7}


def run_arbor(model: Path, cache: CacheMode, *, warm: bool = False) -> dict[int, dict[str, Any]]:
    data = scenario(str(model), warm=warm)
    report = replay(
        parse_scenario(data),
        cache=cache,
        runtime_settings=RuntimeSettings(n_ctx=4096, n_batch=512, n_threads=THREADS),
    )
    if warm:
        return {mine: report["steps"][i] for i, mine in WARMED.items()}
    return {i: report["steps"][i] for i in MEASURED} | {-1: report["steps"][2]}


def run_plain(model: Path) -> dict[int, dict[str, Any]]:
    """The same operations as a plain llama-cpp-python chat app performs them."""
    from llama_cpp import Llama

    llm = Llama(str(model), n_ctx=4096, n_batch=512, n_threads=THREADS, seed=42, verbose=False)
    data = scenario(str(model))
    turns = [s["text"] for s in data["steps"][:3]]
    out: dict[int, dict[str, Any]] = {}

    def ask(messages: list[dict[str, str]]) -> tuple[str, float]:
        started = time.perf_counter()
        first: float | None = None
        pieces: list[str] = []
        for chunk in llm.create_chat_completion(
            messages=messages, temperature=0.0, max_tokens=MAX_TOKENS, stream=True, seed=42
        ):
            delta = chunk["choices"][0]["delta"].get("content")
            if delta:
                first = first or time.perf_counter()
                pieces.append(delta)
        return "".join(pieces), ((first or time.perf_counter()) - started) * 1000.0

    history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    replies: list[str] = []
    for turn in turns:
        history.append({"role": "user", "content": turn})
        reply, ttft = ask(history)
        history.append({"role": "assistant", "content": reply})
        replies.append(reply)
    out[-1] = {"ttft_ms": ttft}
    edited = [*history[:5], {"role": "user", "content": turns[2] + " Be brief."}]
    out[3] = {"ttft_ms": ask(edited)[1]}
    out[4] = {"ttft_ms": ask(edited)[1]}  # regenerate: the same prompt again
    early = [*history[:1], {"role": "user", "content": "Tell me about rivers."}]
    ask(early)
    back = [*history, {"role": "user", "content": "Thanks. And the herons?"}]
    out[7] = {"ttft_ms": ask(back)[1]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, help="write the Markdown table here")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--models", default="smollm2,mamba")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("ARBOR_HOME", str(Path(tmp) / "home"))
        models: dict[str, Path] = {}
        for name in args.models.split(","):
            if name == "smollm2":
                models["SmolLM2-135M Q4_1 (dense)"] = default_model_path()
            elif name == "mamba":
                path = Path(tmp) / "mamba-12x768.gguf"
                write_realistic_mamba(path, default_model_path())
                models["random Mamba 12x768 f32 (recurrent)"] = path
        for label, path in models.items():
            log.info("benchmarking %s", label)
            results[label] = {
                "checkpoints": run_arbor(path, CacheMode.CHECKPOINTS),
                "warmed": run_arbor(path, CacheMode.CHECKPOINTS, warm=True),
                "none": run_arbor(path, CacheMode.NONE),
                "plain": run_plain(path),
            }
    table = render(results)
    print(table)
    if args.out:
        args.out.write_text(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


def render(results: dict[str, Any]) -> str:
    lines = [
        "| model | operation | prompt tokens | Arbor: decoded / TTFT | Arbor, warmed while "
        "idle: decoded / TTFT | full reprocess (`--cache none`): decoded / TTFT "
        "| plain llama-cpp-python: TTFT |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in results.items():
        rows = [(-1, "send the third long message"), *list(MEASURED.items())]
        for index, name in rows:
            a, n, p = r["checkpoints"][index], r["none"][index], r["plain"][index]
            w = r["warmed"].get(index)
            warmed = (f"{w['decoded_tokens']} / {w['ttft_ms'] / 1000:.2f} s" if w is not None
                      else "—")
            lines.append(
                f"| {label} | {name} | {a['prompt_tokens']} | {a['decoded_tokens']} / "
                f"{a['ttft_ms'] / 1000:.2f} s | {warmed} | {n['decoded_tokens']} / "
                f"{n['ttft_ms'] / 1000:.2f} s | {p['ttft_ms'] / 1000:.2f} s |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
