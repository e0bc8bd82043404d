"""An API-level session: what a SillyTavern-like client does to a local OpenAI-compatible
server, against `arbor-engine serve`, llama-server and llama-cpp-python's own server.

Each turn the client sends a new user message and streams the reply, then "swipes" twice (the
same messages again, another seed: a new reply to choose from), and keeps the last swipe.
When the conversation reaches one of the session's lengths, it edits the user message three
turns back (a side branch), then returns to the first branch with a new message. The session
goes on to the next length on that branch, so one session per server measures every length.

Every request goes over a fresh HTTP connection (a reused keep-alive connection was once
dropped by llama-server without a response), streams with usage, and is timed from the
request to the first text. Reused and decoded prompt tokens are what each server reports:
`usage.prompt_tokens_details.cached_tokens` (Arbor, llama-server) or llama-server's
`timings`; llama-cpp-python's server reports neither (None).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx

from engine.bench import llama_server
from engine.bench.cases import paragraph
from engine.bench.llama_server import ServerAbsent
from engine.bench.stats import Spread

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # a server loading a model (and llama-server's first start)
REQUEST_TIMEOUT_S = 600.0
REPLY_TOKENS = 32
SWIPES = 2
EDIT_BACK = 3  # turns back from the last user message
TURN_WORDS = 240  # words per user message (a long roleplay turn: ~300 tokens)
RECENT_TURNS = 3  # the turns before a length whose new-turn and swipe figures are reported
EDIT_TEXT = "Start over, but this time tell it from the heron's side."
RETURN_TEXT = "Back to the story as it was. What happens at the mill next?"
PAUSE_S = 1.0  # between a reply and the next request: a user reading, choosing, typing


class Refused(RuntimeError):
    """The server answered a request with an error status (a prompt over its context)."""


class SessionCut(Exception):
    """A server refused a request: the session stops there, and keeps the lengths it
    finished."""

    def __init__(self, reason: str, measures: list[Measure]) -> None:
        super().__init__(reason)
        self.measures = measures


class Server(StrEnum):
    ARBOR = "arbor"
    LLAMA_SERVER = "llama-server"
    LLAMA_CPP_PYTHON = "llama-cpp-python"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Server.ARBOR: "arbor-engine serve",
    Server.LLAMA_SERVER: "llama-server (checkpoints, RAM cache)",
    Server.LLAMA_CPP_PYTHON: "llama-cpp-python server",
}


class Step(StrEnum):
    TURN = "turn"  # a new user message
    SWIPE = "swipe"  # the same messages again
    EDIT_BACK = "edit_back"  # the user message three turns back, edited
    RETURN = "return"  # back to the first branch, a new message

    @property
    def label(self) -> str:
        return _STEPS[self]


_STEPS = {
    Step.TURN: "new turn",
    Step.SWIPE: "swipe",
    Step.EDIT_BACK: f"edit {EDIT_BACK} turns back",
    Step.RETURN: "return to the first branch",
}


@dataclass(frozen=True)
class Answer:
    """One streamed reply, as the client saw it."""

    text: str
    ttft_ms: float
    prompt_tokens: int | None
    cached_tokens: int | None  # prompt tokens the server reused (None: not reported)
    completion_tokens: int
    gen_tps: float | None  # tokens per second after the first (None: fewer than two)

    @property
    def decoded(self) -> int | None:
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class Measure:
    """One request of the session."""

    server: str
    model: str
    step: str
    length: int  # the session length this request counts towards
    turn: int
    answer: Answer


@dataclass(frozen=True)
class Plan:
    """The session: the lengths (prompt tokens) it measures at, and its turns' sizes."""

    lengths: tuple[int, ...]
    turn_words: int = TURN_WORDS
    reply_tokens: int = REPLY_TOKENS
    swipes: int = SWIPES
    pause_s: float = PAUSE_S  # the same for every server: what a warm-up can use

    @property
    def n_ctx(self) -> int:
        """Room for the longest length, the next turn and its reply."""
        return max(self.lengths) + 4 * self.turn_words + 4 * self.reply_tokens + 256


# --- asking ----------------------------------------------------------------------------------


Messages = list[dict[str, str]]


def served_model(url: str) -> str:
    """The id of the model the server at `url` serves (the first it lists)."""
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        response = client.get(f"{url}/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])


def ask(url: str, messages: Messages, *, model: str, max_tokens: int, seed: int,
        temperature: float = 0.7) -> Answer:
    """Stream one chat completion from `url` (the server's base, ending in /v1) over a new
    connection; what the client saw."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "seed": seed,
            "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    stamps: list[float] = []
    started = time.perf_counter()
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client, client.stream(
            "POST", f"{url}/chat/completions", json=body,
            headers={"Connection": "close"}) as response:
        if response.status_code != 200:
            response.read()
            raise Refused(f"answered {response.status_code}: {response.text[:300]}")
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices") or ():
                text = (choice.get("delta") or {}).get("content") or ""
                if text:
                    stamps.append(time.perf_counter())
                    pieces.append(text)
    ended = time.perf_counter()
    first = stamps[0] if stamps else ended
    completion = int(usage.get("completion_tokens") or len(stamps))
    gen_tps = None
    if completion > 1 and len(stamps) > 1 and stamps[-1] > first:
        gen_tps = (completion - 1) / (stamps[-1] - first)
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if cached is None and "cache_n" in timings:
        cached = timings["cache_n"]
    return Answer(text="".join(pieces), ttft_ms=(first - started) * 1000.0,
                  prompt_tokens=int(prompt) if prompt is not None else None,
                  cached_tokens=int(cached) if cached is not None else None,
                  completion_tokens=completion, gen_tps=gen_tps)


def user_turn(k: int, words: int) -> str:
    return f"Go on with the story, turn {k + 1}: {paragraph(words, k * 11)}"


def run_session(url: str, plan: Plan, *, server: str, model: str,
                at_turns: Sequence[int] | None = None,
                on_measure: Callable[[Measure], None] | None = None) -> list[Measure]:
    """The whole session against one server (see the module). A length is reached when the
    server reports that many tokens in the prompt and the reply, or, with `at_turns`, after
    as many turns as another server's session took (llama-cpp-python's server does not
    report its streams' usage): `reached_at` of that session."""
    if at_turns is not None and len(at_turns) > len(plan.lengths):
        raise ValueError("at most one turn count per length")
    out: list[Measure] = []
    history: Messages = []
    # with `at_turns` from a session that was cut, the lengths it reached
    lengths = sorted(plan.lengths)[:len(at_turns) if at_turns is not None else None]
    pending = list(lengths)
    turn = 0
    seed = 1
    served = served_model(url)

    def request(step: Step, messages: Messages, length: int) -> Answer:
        nonlocal seed
        if out and plan.pause_s > 0:
            time.sleep(plan.pause_s)
        try:
            answer = ask(url, messages, model=served, max_tokens=plan.reply_tokens,
                         seed=seed)
        except Refused as exc:
            raise SessionCut(f"stopped before {length:,} tokens: {exc}",
                             [m for m in out if m.length < length]) from None
        seed += 1
        measure = Measure(server, model, step.value, length, turn, answer)
        out.append(measure)
        if on_measure is not None:
            on_measure(measure)
        return answer

    while pending:
        length = pending[0]
        history.append({"role": "user", "content": user_turn(turn, plan.turn_words)})
        answer = request(Step.TURN, history, length)
        for _ in range(plan.swipes):
            answer = request(Step.SWIPE, history, length)
        history.append({"role": "assistant", "content": answer.text})
        turn += 1
        if at_turns is not None:
            reached = turn == at_turns[len(lengths) - len(pending)]
        elif answer.prompt_tokens is None:
            raise ServerAbsent("does not report its prompt's tokens: give the turns another "
                               "server's session took")
        else:
            reached = answer.prompt_tokens + answer.completion_tokens >= length
        if not reached:
            continue
        pending.pop(0)
        back = len(history) - 2 * EDIT_BACK
        if back >= 0:
            request(Step.EDIT_BACK, [*history[:back], {"role": "user", "content": EDIT_TEXT}],
                    length)
        history.append({"role": "user", "content": f"{RETURN_TEXT} ({turn})"})
        answer = request(Step.RETURN, history, length)
        history.append({"role": "assistant", "content": answer.text})
        turn += 1
    return out


def reached_at(measures: Sequence[Measure]) -> list[int] | None:
    """The turns at which a session reached its lengths (None: it measured none)."""
    turns = sorted(m.turn for m in measures if m.step == Step.RETURN)
    return turns or None


class ServerChat:
    """A chat app on a server's API, as the benchmark's cases drive one: greedy replies, the
    prompt tokens decoded as the server reports them; a reply continued by sending it as the
    last message (an assistant prefill, which llama-server continues)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.model = served_model(url)

    def ask(self, messages: Messages, max_tokens: int) -> tuple[str, float, int]:
        answer = ask(self.url, messages, model=self.model, max_tokens=max_tokens, seed=0,
                     temperature=0.0)
        if answer.decoded is None:
            raise ServerAbsent(f"{self.url} does not report the prompt tokens it reused")
        return answer.text, answer.ttft_ms, answer.decoded

    def resume(self, messages: Messages, partial: str,
               max_tokens: int) -> tuple[str, float, int]:
        return self.ask([*messages, {"role": "assistant", "content": partial}], max_tokens)


# --- the servers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """How to start one server on a model, and where it answers."""

    command: list[str]
    url: str  # the OpenAI base URL, ending in /v1
    env: dict[str, str] | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(server: Server, model: Path, *, n_ctx: int, n_batch: int, n_threads: int,
           db: Path | None = None, swa_full: bool = False) -> Launch:
    """The command line of `server` on `model`; ServerAbsent if it cannot run here."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    if server is Server.ARBOR:
        if db is None:
            raise ValueError("arbor-engine serve keeps its conversations in a database file")
        return Launch([sys.executable, "-c", "from engine.cli.main import main; main()",
                       "serve", "--model", str(model), "--port", str(port),
                       "--ctx-size", str(n_ctx), "--threads", str(n_threads),
                       "--db", str(db)], url)
    if server is Server.LLAMA_CPP_PYTHON:
        try:
            import fastapi  # noqa: F401
            import pydantic_settings  # noqa: F401
            import starlette_context  # noqa: F401
        except ImportError as exc:
            raise ServerAbsent(f"llama-cpp-python's server needs {exc.name} "
                               f"(pip install 'llama-cpp-python[server]')") from None
        return Launch([sys.executable, "-m", "engine.bench.plain_server", "--model",
                       str(model), "--port", str(port), "--n-ctx", str(n_ctx),
                       "--n-batch", str(n_batch), "--threads", str(n_threads)], url)
    args, env = llama_server.command(
        model, host="127.0.0.1", port=port,
        options=llama_server.Options(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                     swa_full=swa_full))
    return Launch(args, url, env)


@contextlib.contextmanager
def running(spec: Launch, log_file: Path) -> Iterator[str]:
    """The server started and answering /v1/models; stopped (SIGINT, then killed) after."""
    with open(log_file, "ab") as sink:
        process = subprocess.Popen(spec.command, stdout=sink, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(spec.env or {})},
                                   start_new_session=True)
    try:
        _wait_ready(spec.url, process, log_file)
        yield spec.url
    finally:
        _stop(process)


def _wait_ready(url: str, process: subprocess.Popen[bytes], log_file: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_file.read_text(encoding="utf-8", errors="replace")[-600:]
            raise ServerAbsent(f"exited with status {process.returncode} before answering: "
                               f"{tail.strip()}")
        try:
            with httpx.Client(timeout=5.0) as client:
                if client.get(f"{url}/models").status_code == 200:
                    return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise ServerAbsent(f"did not answer within {START_TIMEOUT_S:g} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# --- a whole run -----------------------------------------------------------------------------


def measure(models: Sequence[tuple[str, Path]], servers: Sequence[Server], plan: Plan, *,
            n_threads: int, n_batch: int = 512, work: Path | None = None,
            on_measure: Callable[[Measure], None] | None = None,
            ) -> tuple[list[Measure], dict[str, str]]:
    """Every server's session on every model, one server at a time; the measures, and the
    reason for each server that could not run (keyed "server" or "server/model")."""
    measures: list[Measure] = []
    absent: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="arbor-api-bench-") as tmp:
        folder = work or Path(tmp)
        for name, path in models:
            turns: list[int] | None = None  # where the first session reached each length
            for server in servers:
                if server.value in absent:
                    continue
                try:
                    spec = launch(server, path, n_ctx=plan.n_ctx, n_batch=n_batch,
                                  n_threads=n_threads, db=Path(tmp) / f"{name}.db")
                except ServerAbsent as exc:
                    absent[server.value] = str(exc)
                    log.warning("%s: absent: %s", server.label, exc)
                    continue
                log.info("%s on %s: a session to %s tokens", server.label, name,
                         ", ".join(map(str, plan.lengths)))
                try:
                    with running(spec, folder / f"{server.value}-{name}.log") as url:
                        got = run_session(url, plan, server=server.value, model=name,
                                          at_turns=turns, on_measure=on_measure)
                    measures += got
                    turns = turns or reached_at(got)
                except SessionCut as exc:
                    measures += exc.measures
                    turns = turns or reached_at(exc.measures)
                    absent[f"{server.value}/{name}"] = str(exc)
                    log.warning("%s on %s: %s", server.label, name, exc)
                except ServerAbsent as exc:
                    absent[f"{server.value}/{name}"] = str(exc)
                    log.warning("%s on %s: %s", server.label, name, exc)
    return measures, absent


@dataclass(frozen=True)
class Row:
    """One server's figures at one length on one model (medians)."""

    model: str
    server: str
    length: int
    ttft_ms: dict[str, float | None]  # per step
    decoded: dict[str, float | None]  # prompt tokens decoded, per step (None: not reported)
    gen_tps: float | None
    decoded_total: int | None  # prompt tokens decoded by every request up to this length


def summarise(measures: Sequence[Measure]) -> list[Row]:
    """Medians per (model, server, length): new turns and swipes of the last RECENT_TURNS
    turns before the length, the edit and the return at it."""
    rows: list[Row] = []
    keys = sorted({(m.model, m.server, m.length) for m in measures},
                  key=lambda k: (k[0], k[1], k[2]))
    for model, server, length in keys:
        mine = [m for m in measures if (m.model, m.server, m.length) == (model, server, length)]
        turns = sorted({m.turn for m in mine if m.step in (Step.TURN, Step.SWIPE)})
        recent = set(turns[-RECENT_TURNS:])
        ttft: dict[str, float | None] = {}
        decoded: dict[str, float | None] = {}
        for step in Step:
            picked = [m for m in mine if m.step == step and
                      (step not in (Step.TURN, Step.SWIPE) or m.turn in recent)]
            ttft[step.value] = Spread.of([m.answer.ttft_ms for m in picked]).median \
                if picked else None
            counts = [m.answer.decoded for m in picked]
            decoded[step.value] = Spread.of([float(c) for c in counts if c is not None]).median \
                if picked and all(c is not None for c in counts) else None
        speeds = [m.answer.gen_tps for m in mine if m.answer.gen_tps is not None]
        upto = [m for m in measures if m.model == model and m.server == server and
                m.length <= length]
        totals = [m.answer.decoded for m in upto]
        rows.append(Row(model, server, length, ttft, decoded,
                        Spread.of(speeds).median if speeds else None,
                        sum(t for t in totals if t is not None)
                        if all(t is not None for t in totals) else None))
    return rows


def to_json(measures: Sequence[Measure], absent: dict[str, str], plan: Plan) -> dict[str, Any]:
    return {"plan": {**asdict(plan), "n_ctx": plan.n_ctx, "edit_back": EDIT_BACK},
            "absent": absent, "measures": [asdict(m) for m in measures]}


def from_json(data: dict[str, Any]) -> list[Measure]:
    return [Measure(**{**m, "answer": Answer(**m["answer"])}) for m in data["measures"]]


def markdown(data: dict[str, Any], *, heading: str = "###") -> str:
    """The session's table: time to first token per step (and prompt tokens decoded), per
    model, length and server."""
    rows = summarise(from_json(data))
    plan = data["plan"]
    lines = [f"{heading} A SillyTavern-like session over the API", "",
             f"Each turn a new user message of {plan['turn_words']} words and a reply of "
             f"{plan['reply_tokens']} tokens, then {plan['swipes']} swipes; at each length an "
             f"edit {plan['edit_back']} turns back and a return to the first branch "
             f"(n_ctx {plan['n_ctx']}), {plan.get('pause_s', 0):g} s between a reply and "
             f"the next request. Medians of the last {RECENT_TURNS} turns; time to "
             f"first token in seconds, prompt tokens decoded in brackets.", ""]
    steps = list(Step)
    lines.append("| model | length | server | " + " | ".join(s.label for s in steps) +
                 " | tokens/s | decoded in all |")
    lines.append("|---|---|---|" + "---|" * len(steps) + "---|---|")
    for row in rows:
        cells = []
        for step in steps:
            t, d = row.ttft_ms[step.value], row.decoded[step.value]
            cells.append("-" if t is None else
                         f"{t / 1000:.2f}" + ("" if d is None else f" ({d:.0f})"))
        label = Server(row.server).label if row.server in {s.value for s in Server} \
            else row.server
        lines.append(f"| {row.model} | {row.length:,} | {label} | " + " | ".join(cells) +
                     f" | {'-' if row.gen_tps is None else f'{row.gen_tps:.1f}'} | "
                     f"{'-' if row.decoded_total is None else f'{row.decoded_total:,}'} |")
    for who, why in sorted(data.get("absent", {}).items()):
        lines += ["", f"{who}: not run: {why}"]
    return "\n".join(lines) + "\n"
