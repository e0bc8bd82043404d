"""`python -m engine` / `arbor-engine`: everything the app does to a conversation, headless.

The contract: bad input (arguments, files, paths, ids) exits 2 with one line on stderr, and a
failure that is not the input's exits 1 with one line; never a traceback (with -vv an
unexpected error logs one). Whatever comes from outside is printed through `printable`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from engine.bench.main import add_arguments as add_bench_arguments
from engine.cli import hub as hub_cli
from engine.config.endpoints import RpcError, parse_endpoints
from engine.config.params import CacheMode, CheckpointOptions
from engine.config.settings import SettingsError
from engine.core.errors import (
    ArborError,
    EngineCrashed,
    ModelLoadError,
    ModelNotFoundError,
    printable,
)
from engine.core.schedule import DEFAULT_INTERVAL
from engine.files.paths import data_dirs
from engine.files.regular import FormatError
from engine.llm.rpc import run_worker, unreachable
from engine.models.files import list_models, read_model_info, resolve_model
from engine.models.remote import BadRepoNameError, HubNotFoundError
from engine.service.client import engine_log
from engine.service.scenario import ScenarioError, load_scenario
from engine.storage.database import StoreOpenError
from engine.storage.store import Store
from engine.storage.transfer import (
    FileFormat,
    commit_import,
    export_file,
    format_for_export,
    parse_import,
)

log = logging.getLogger("engine")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
MAX_MESSAGE = 500  # characters of an error line, whatever it quotes


class UsageError(ArborError):
    """Bad input the command line itself finds (an id that is not there, a path it cannot
    write)."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in one line (its own prints the usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {printable(message, MAX_MESSAGE)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="arbor-engine", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True)

    bp = sub.add_parser("bench", help="Arbor against full reprocessing and llama-cpp-python, "
                        "every memory kind (see engine/bench)")
    add_bench_arguments(bp)

    rp = sub.add_parser("replay", help="drive a scenario headless and report each step")
    rp.add_argument("scenario", type=Path)
    rp.add_argument("--model", help="a GGUF path or 'default'; overrides the scenario's")
    rp.add_argument(
        "--cache",
        choices=[m.value for m in CacheMode],
        default=CacheMode.CHECKPOINTS.value,
        help="'none' clears the context and decodes the whole prompt at every step",
    )
    rp.add_argument("--report", type=Path, help="write the JSON report here (default: stdout)")
    rp.add_argument("--db", type=Path, help="persist the conversation to this database")
    rp.add_argument(
        "--engine-process", action="store_true",
        help="run the model in an engine process of its own, as the app does",
    )
    rp.add_argument(
        "--checkpoint-interval", type=int, default=DEFAULT_INTERVAL, metavar="TOKENS",
        help="at most one checkpoint per this many tokens inside long messages (<=0: none)",
    )
    rp.add_argument("--ram-budget", type=int, metavar="MIB", help="checkpoint RAM budget")
    rp.add_argument(
        "--disk-tier", action="store_true",
        help="spill checkpoints to the user cache dir instead of dropping them",
    )
    rp.add_argument("--rpc", metavar="HOST:PORT,...", type=_workers, default=(),
                    help="llama.cpp RPC workers that take the layers (implies "
                         "--engine-process: a worker that dies ends that process, not this)")

    info = sub.add_parser("info", help="describe a GGUF model from its header")
    info.add_argument("model", nargs="?", default="default")

    sub.add_parser("models", help="list the bundled model and the models folder")

    kn = sub.add_parser("kernels", help="which llama.cpp kernels run here, checked on a model "
                                        "in this process; --rounds times weight repacking")
    kn.add_argument("model", nargs="?", default="default")
    kn.add_argument("--rounds", type=int, default=0,
                    help="time repacking on against off this many times, interleaved")
    kn.add_argument("--threads", type=int, default=0, help="0: Arbor's default")
    kn.add_argument("--prompt", type=int, default=512, help="prompt tokens to decode")
    kn.add_argument("--generate", type=int, default=64, help="tokens to decode one by one")

    ex = sub.add_parser("export", help="write conversations to a file")
    ex.add_argument("--db", type=Path, help="the conversation database (default: the user's)")
    ex.add_argument("--conversation", type=int, action="append", required=True,
                    help="a conversation id (repeat for several)")
    ex.add_argument("--format", choices=[f.value for f in FileFormat],
                    help="default: from OUT's suffix (.arbor, .json = ChatGPT, .md)")
    ex.add_argument("out", type=Path)

    sv = sub.add_parser("serve", help="a local OpenAI-compatible API on the model")
    sv.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (anything but loopback needs --allow-remote "
                         "and --api-key)")
    sv.add_argument("--port", type=int, default=8080)
    sv.add_argument("--model", default="default", help="a GGUF path or 'default'")
    sv.add_argument("--ctx-size", type=int, metavar="N",
                    help="tokens of context (default: the app's setting)")
    sv.add_argument("--threads", type=int, metavar="N",
                    help="CPU threads (default: the app's setting; 0: automatic)")
    key = sv.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="clients must send 'Authorization: Bearer KEY' (every "
                                       "local user can read a command line: prefer the file "
                                       "or ARBOR_API_KEY)")
    key.add_argument("--api-key-file", type=Path, metavar="FILE",
                     help="the key, from a file only you can read (mode 0600)")
    sv.add_argument("--allow-remote", action="store_true",
                    help="let other machines connect (with --api-key)")
    sv.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                    help="allow browser pages from this origin (repeat; default: none)")
    sv.add_argument("--db", type=Path, help="the conversation database (default: the user's)")
    sv.add_argument("--rpc", metavar="HOST:PORT,...", type=_workers, default=(),
                    help="llama.cpp RPC workers that take the layers")

    rw = sub.add_parser("rpc-worker", help="run a llama.cpp RPC worker for this build")
    rw.add_argument("--host", default="127.0.0.1",
                    help="address to listen on; the protocol has no authentication: use "
                         "only on a trusted network or through an SSH tunnel")
    rw.add_argument("--port", type=int, default=50052)
    rw.add_argument("--threads", type=int, default=0, help="0: llama.cpp's default")

    se = sub.add_parser("search", help="find GGUF models on Hugging Face")
    hub_cli.add_search_arguments(se)
    pu = sub.add_parser("pull", help="download a model from Hugging Face into the models "
                                     "folder (resumes when run again)")
    hub_cli.add_pull_arguments(pu)

    im = sub.add_parser("import", help="add conversations from a session file or export")
    im.add_argument("file", type=Path)
    im.add_argument("--db", type=Path, help="the conversation database (default: the user's)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _run(args)
    except (ScenarioError, ModelNotFoundError, ModelLoadError, FormatError, StoreOpenError,
            UsageError, OSError, BadRepoNameError, HubNotFoundError) as exc:
        return _fail(exc, EXIT_BAD_INPUT)
    except ArborError as exc:
        return _fail(exc, EXIT_FAILED)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:  # a bug: one line for the user, the traceback with -vv
        log.debug("unexpected error", exc_info=True)
        return _fail(f"unexpected error ({type(exc).__name__}: {exc}); -vv shows where",
                     EXIT_FAILED)


def _workers(text: str) -> tuple[str, ...]:
    """--rpc's value: host:port addresses, comma-separated."""
    try:
        return tuple(str(e) for e in parse_endpoints(text))
    except RpcError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run(args: argparse.Namespace) -> int:
    if args.command == "replay":
        return _replay(args)
    if args.command == "bench":
        from engine.bench.main import main as bench  # loads llama.cpp

        return bench(args)
    if args.command == "rpc-worker":
        if not 1 <= args.port <= 65535:
            raise UsageError(f"--port must be 1..65535, not {args.port}")
        sys.stderr.write(f"arbor-engine: RPC worker on {args.host}:{args.port} (no "
                         f"authentication: trusted networks or an SSH tunnel only)\n")
        return run_worker(args.host, args.port, args.threads)
    if args.command == "serve":
        return _serve(args)
    if args.command == "kernels":
        from engine.llm.kernels import check  # loads llama.cpp

        if not 0 <= args.rounds <= 100:
            raise UsageError(f"--rounds must be 0..100, not {args.rounds}")
        if not (2 <= args.prompt <= 32768 and 1 <= args.generate <= 4096):
            raise UsageError("--prompt must be 2..32768 and --generate 1..4096")
        _print_json(check(resolve_model(args.model), rounds=args.rounds,
                          n_threads=args.threads, prompt=args.prompt,
                          generated=args.generate))
        return EXIT_OK
    if args.command == "info":
        info = read_model_info(resolve_model(args.model))
        _print_json({
            "name": info.name, "path": str(info.path), "architecture": info.architecture,
            "size_bytes": info.size_bytes, "context_length": info.context_length,
            "sliding_window": info.sliding_window, "memory_kind": info.memory_kind.value,
            "has_chat_template": info.chat_template is not None,
        })
        return EXIT_OK
    # The app may be streaming a reply into the same database: only its own start marks
    # replies left streaming as interrupted (recover=False here).
    if args.command == "export":
        fmt = format_for_export(args.out, args.format)
        with Store(args.db, recover=False) as store:
            known = {info.id for info in store.list(include_deleted=True)}
            missing = [cid for cid in args.conversation if cid not in known]
            if missing:
                raise UsageError(f"there is no conversation {missing[0]} in {store.path}")
            with _writing(args.out):
                export_file(store, args.conversation, args.out, fmt)
        sys.stdout.write(f"wrote {printable(args.out)}\n")
        return EXIT_OK
    if args.command == "import":
        parsed = parse_import(args.file)  # a rejected file never opens (or makes) the store
        with Store(args.db, recover=False) as store:
            result = commit_import(parsed, store)
        for cid, title in zip(result.conversation_ids, result.titles, strict=True):
            sys.stdout.write(f"imported conversation {cid}: {printable(title)}\n")
        if result.checkpoints_dropped:
            sys.stdout.write(f"dropped {result.checkpoints_dropped} checkpoints made "
                             f"elsewhere (the engine will reprocess)\n")
        return EXIT_OK
    if args.command == "search":
        if not 1 <= args.limit <= 100:
            raise UsageError(f"--limit must be 1..100, not {args.limit}")
        return hub_cli.search(args)
    if args.command == "pull":
        return hub_cli.pull(args)
    if args.command == "models":
        for path in list_models(data_dirs()):
            sys.stdout.write(f"{printable(path, limit=4096)}\n")
        return EXIT_OK
    raise AssertionError(args.command)


def _serve(args: argparse.Namespace) -> int:
    from engine.api.serve import serve  # the HTTP stack: only the command that serves
    from engine.api.server import ServerOptions, api_key_of
    from engine.config.settings import load_settings

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, not {args.port}")
    try:
        api_key = api_key_of(args.api_key, args.api_key_file, os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    options = ServerOptions(host=args.host, port=args.port, api_key=api_key,
                            allow_remote=args.allow_remote,
                            cors_origins=tuple(args.cors_origin))
    settings = load_settings().settings
    try:
        settings = replace(
            settings, rpc_workers=args.rpc,
            n_ctx=settings.n_ctx if args.ctx_size is None else args.ctx_size,
            n_threads=settings.n_threads if args.threads is None else args.threads)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
    try:
        serve(resolve_model(args.model), settings, args.db, options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return EXIT_OK


def _replay(args: argparse.Namespace) -> int:
    from engine.service.replay import replay  # loads llama.cpp: only the command that runs a model

    scenario = load_scenario(args.scenario)
    options = CheckpointOptions(
        interval=args.checkpoint_interval,
        ram_budget=args.ram_budget << 20 if args.ram_budget is not None else None,
        disk_dir=data_dirs().cache / "checkpoints" if args.disk_tier else None,
    )
    try:
        report = replay(
            scenario, model=args.model, cache=CacheMode(args.cache), checkpoints=options,
            db=args.db, engine_process=args.engine_process or bool(args.rpc),
            rpc_workers=args.rpc,
        )
    except EngineCrashed as exc:
        if not args.rpc:
            raise
        gone = unreachable(parse_endpoints(args.rpc))
        named = "; ".join(f"{e} ({why})" for e, why in gone) or "none found down now"
        raise UsageError(f"{exc}: an RPC worker stopped answering ({named}); llama.cpp's "
                         f"messages are in {printable(engine_log())}") from None
    text = json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    if args.report:
        with _writing(args.report):
            args.report.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _print_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _fail(error: object, status: int) -> int:
    """One line on stderr, whatever the error quotes (escaped, cut to MAX_MESSAGE)."""
    sys.stderr.write(f"arbor-engine: {printable(error, MAX_MESSAGE)}\n")
    return status


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """An OSError while writing `path` as a UsageError naming `path` (not the temp file the
    write went through, nor a folder on the way)."""
    try:
        yield
    except OSError as exc:
        raise UsageError(f"cannot write {printable(path)}: {exc.strerror or exc}") from exc
