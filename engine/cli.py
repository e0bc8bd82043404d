"""`python -m engine` / `arbor-engine`: everything the app does to a conversation, headless."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from engine.checkpoints import DEFAULT_INTERVAL
from engine.errors import ArborError, ModelLoadError, ModelNotFoundError
from engine.formats import FormatError
from engine.model import list_models, read_model_info, resolve_model
from engine.params import CacheMode, CheckpointOptions
from engine.paths import data_dirs
from engine.scenario import ScenarioError, load_scenario
from engine.store import Store, StoreOpenError
from engine.transfer import FileFormat, export_file, format_for_export, import_file

log = logging.getLogger("engine")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arbor-engine", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True)

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

    info = sub.add_parser("info", help="describe a GGUF model from its header")
    info.add_argument("model", nargs="?", default="default")

    sub.add_parser("models", help="list the bundled model and the models folder")

    ex = sub.add_parser("export", help="write conversations to a file")
    ex.add_argument("--db", type=Path, help="the conversation database (default: the user's)")
    ex.add_argument("--conversation", type=int, action="append", required=True,
                    help="a conversation id (repeat for several)")
    ex.add_argument("--format", choices=[f.value for f in FileFormat],
                    help="default: from OUT's suffix (.arbor, .json = ChatGPT, .md)")
    ex.add_argument("out", type=Path)

    im = sub.add_parser("import", help="add conversations from a session file or export")
    im.add_argument("file", type=Path)
    im.add_argument("--db", type=Path, help="the conversation database (default: the user's)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "replay":
            return _replay(args)
        if args.command == "info":
            info = read_model_info(resolve_model(args.model))
            _print_json({
                "name": info.name, "path": str(info.path), "architecture": info.architecture,
                "size_bytes": info.size_bytes, "context_length": info.context_length,
                "sliding_window": info.sliding_window, "memory_kind": info.memory_kind.value,
                "has_chat_template": info.chat_template is not None,
            })
            return EXIT_OK
        if args.command == "export":
            with Store(args.db) as store:
                export_file(store, args.conversation, args.out,
                            format_for_export(args.out, args.format))
            sys.stdout.write(f"wrote {args.out}\n")
            return EXIT_OK
        if args.command == "import":
            with Store(args.db) as store:
                result = import_file(args.file, store)
            for cid, title in zip(result.conversation_ids, result.titles, strict=True):
                sys.stdout.write(f"imported conversation {cid}: {title}\n")
            if result.checkpoints_dropped:
                sys.stdout.write(f"dropped {result.checkpoints_dropped} checkpoints made "
                                 f"elsewhere (the engine will reprocess)\n")
            return EXIT_OK
        if args.command == "models":
            for path in list_models(data_dirs()):
                sys.stdout.write(f"{path}\n")
            return EXIT_OK
    except (ScenarioError, ModelNotFoundError, ModelLoadError, FormatError, StoreOpenError) as exc:
        sys.stderr.write(f"arbor-engine: {exc}\n")
        return EXIT_BAD_INPUT
    except ArborError as exc:
        sys.stderr.write(f"arbor-engine: {exc}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write("arbor-engine: interrupted\n")
        return 130
    raise AssertionError(args.command)


def _replay(args: argparse.Namespace) -> int:
    from engine.replay import replay  # loads llama.cpp: only the command that runs a model

    scenario = load_scenario(args.scenario)
    options = CheckpointOptions(
        interval=args.checkpoint_interval,
        ram_budget=args.ram_budget << 20 if args.ram_budget is not None else None,
        disk_dir=data_dirs().cache / "checkpoints" if args.disk_tier else None,
    )
    report = replay(
        scenario, model=args.model, cache=CacheMode(args.cache), checkpoints=options,
        db=args.db, engine_process=args.engine_process,
    )
    text = json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    if args.report:
        args.report.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _print_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
