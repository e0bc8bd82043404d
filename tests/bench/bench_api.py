"""Benchmark: a SillyTavern-like session through the OpenAI API, Arbor against llama-cpp-python.

The same session is sent to `arbor-engine serve` and to llama-cpp-python's own server
(`python -m llama_cpp.server`), same model file, context and threads, one request at a time,
the two servers alternating request by request: 20 turns, each answered and then swiped twice
(the same request again), then an edit of the user message three turns back, then a return to
the first branch with one more message. Per kind of request: the prompt tokens each server
decoded (Arbor: `prompt_tokens - cached_tokens` from its usage; llama-cpp-python: what its
verbose log says it evaluated) and the median time to the first streamed token.

    .venv/bin/pip install fastapi pydantic-settings starlette-context   # llama_cpp.server's
    .venv/bin/python -m tests.bench.bench_api [--turns 20] [--models dense,recurrent]

The recurrent model is a random-weight Mamba of realistic cost (12 x 768), written on first
use; its replies are noise, which costs nothing here (every reply runs to max_tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are Mira, a ship's navigator in a story. Stay in character and answer briefly."
MAX_TOKENS = 48
N_CTX = 4096
THREADS = 2


def user_text(turn: int) -> str:
    return (f"Turn {turn}: the wind turns to the {['north', 'east', 'south', 'west'][turn % 4]} "
            f"and the crew asks you what to do about sail number {turn}. Tell them, and say "
            f"why, in a sentence or two.")


@dataclass
class Served:
    name: str
    process: subprocess.Popen[str]
    url: str
    lines: queue.Queue[str] = field(default_factory=queue.Queue)

    def start_reader(self) -> None:
        def read() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.lines.put(line)
        threading.Thread(target=read, daemon=True).start()

    def drain(self) -> list[str]:
        out: list[str] = []
        while not self.lines.empty():
            out.append(self.lines.get_nowait())
        return out

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(served: Served) -> None:
    for _ in range(1200):
        if served.process.poll() is not None:
            raise RuntimeError(f"{served.name} exited: {''.join(served.drain())[-2000:]}")
        try:
            if httpx.get(served.url + "/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{served.name} did not start")


def start_arbor(model: Path, home: Path) -> Served:
    port = free_port()
    env = {**os.environ, "ARBOR_HOME": str(home)}
    process = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", str(port),
         "--db", str(home / "api.db")], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    served = Served("arbor", process, f"http://127.0.0.1:{port}/v1")
    served.start_reader()
    wait_up(served)
    return served


def start_llama_cpp(model: Path) -> Served:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--port", str(port),
         "--n_ctx", str(N_CTX), "--n_threads", str(THREADS), "--n_threads_batch", str(THREADS),
         "--verbose", "True"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    served = Served("llama-cpp-python", process, f"http://127.0.0.1:{port}/v1")
    served.start_reader()
    wait_up(served)
    return served


def ask(served: Served, messages: list[dict[str, str]], seed: int) -> tuple[str, float, int]:
    """Stream one reply: its text, the time to its first token, the prompt tokens decoded."""
    served.drain()
    body = {"model": "", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.7,
            "seed": seed, "stream": True, "stream_options": {"include_usage": True}}
    if served.name != "arbor":
        body.pop("model")
    started = time.perf_counter()
    first: float | None = None
    text = ""
    usage: dict[str, Any] = {}
    with httpx.stream("POST", served.url + "/chat/completions", json=body,
                      timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - started
                text += piece
    ttft = first if first is not None else time.perf_counter() - started
    return text, ttft, decoded(served, usage)


PROMPT_EVAL = re.compile(r"prompt eval time =.*/\s*(\d+) tokens")


def decoded(served: Served, usage: dict[str, Any]) -> int:
    if served.name == "arbor":
        return int(usage["prompt_tokens"]) - int(usage["prompt_tokens_details"]["cached_tokens"])
    # llama-cpp-python's streamed answer has no usage; llama.cpp's own count, from its log
    # (printed before the last chunk; wait for the reader to see it).
    for _ in range(400):
        for line in served.drain():
            if match := PROMPT_EVAL.search(line):
                return int(match.group(1))
        time.sleep(0.01)
    raise RuntimeError("llama-cpp-python logged no prompt evaluation")


def settle(served: Served) -> int:
    """Wait for Arbor's warm-up after a reply (the user reading); the tokens it decoded."""
    if served.name != "arbor":
        return 0
    while True:
        stats = httpx.get(served.url.removesuffix("/v1") + "/arbor/stats", timeout=60).json()
        if not stats["warming"]:
            return int(stats["warm_decoded"])
        time.sleep(0.02)


def run(model: Path, turns: int, home: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    servers = [start_arbor(model, home), start_llama_cpp(model)]
    results: dict[str, dict[str, list[tuple[int, float]]]] = {
        s.name: defaultdict(list) for s in servers}
    branches: dict[str, list[dict[str, str]]] = {
        s.name: [{"role": "system", "content": SYSTEM}] for s in servers}
    seed = 0
    warm: dict[str, int] = {}

    def step(kind: str, build: Any) -> str:
        nonlocal seed
        seed += 1
        last = ""
        order = servers if seed % 2 else servers[::-1]  # alternate who goes first
        for served in order:
            text, ttft, tokens = ask(served, build(served.name), seed)
            warm[served.name] = settle(served)
            results[served.name][kind].append((tokens, ttft))
            if served is servers[0]:
                last = text
            branches[served.name + ":last"] = [{"role": "assistant", "content": text}]
        return last

    try:
        for turn in range(turns):
            for name in branches:
                if ":" not in name:
                    branches[name].append({"role": "user", "content": user_text(turn)})
            for kind in ("new message", "swipe", "swipe"):
                step(kind, lambda name: branches[name])
            for name in [n for n in branches if ":" not in n]:
                branches[name] += branches[name + ":last"]
        edit_at = len(branches["arbor"]) - 6  # the user message three turns back
        step("edit 3 turns back", lambda name: [
            *branches[name][:edit_at],
            {"role": "user", "content": "Forget the sails: what do the stars say tonight?"}])
        step("back to the first branch", lambda name: [
            *branches[name], {"role": "user", "content": "Back to the sails. What now?"}])
    finally:
        for served in servers:
            served.stop()
    results["arbor"]["(warm-ups while idle)"] = [(warm.get("arbor", 0), 0.0)]
    return results


def recurrent_model(out: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from engine.bench.random_models import ModelKind, write_tiny_model
    from engine.models.files import default_model_path

    path = out / "mamba-12x768.gguf"
    if not path.exists():
        write_tiny_model(ModelKind.RECURRENT, path, default_model_path(), n_layer=12,
                         n_embd=768)
    return path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--models", default="dense,recurrent")
    args = parser.parse_args()
    from engine.models.files import default_model_path

    with tempfile.TemporaryDirectory() as tmp:
        models = {"dense": default_model_path(), "recurrent": None}
        for kind in args.models.split(","):
            model = models[kind] or recurrent_model(Path(tmp))
            home = Path(tmp) / f"home-{kind}"
            results = run(model, args.turns, home)
            print(f"\n{kind}: {model.name}, {args.turns} turns")
            print("| request | requests | Arbor: tokens decoded | llama-cpp-python: tokens "
                  "decoded | Arbor: median TTFT | llama-cpp-python: median TTFT |")
            print("|---|---|---|---|---|---|")
            arbor, peer = results["arbor"], results["llama-cpp-python"]
            for kind_ in [k for k in arbor if k in peer]:
                a, p = arbor[kind_], peer[kind_]
                print(f"| {kind_} | {len(a)} | {sum(t for t, _ in a):,} | "
                      f"{sum(t for t, _ in p):,} | "
                      f"{statistics.median(s for _, s in a) * 1000:.0f} ms | "
                      f"{statistics.median(s for _, s in p) * 1000:.0f} ms |")
            warmed = arbor["(warm-ups while idle)"][0][0]
            print(f"| warm-ups while the user reads | | {warmed:,} | - | | |")
            total_a = sum(t for v in arbor.values() for t, _ in v)
            total_p = sum(t for v in peer.values() for t, _ in v)
            print(f"| all | | {total_a:,} | {total_p:,} | | |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
