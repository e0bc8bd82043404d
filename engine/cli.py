"""`python -m engine` / `arbor-engine`: everything the app does to a conversation, headless."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from engine.checkpoints import DEFAULT_INTERVAL
from engine.errors import ArborError, ModelLoadError, ModelNotFoundError
from engine.model import list_models, read_model_info, resolve_model
from engine.paths import data_dirs
from engine.replay import CacheMode, CheckpointOptions, replay
from engine.scenario import ScenarioError, load_scenario

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
        if args.command == "models":
            for path in list_models(data_dirs()):
                sys.stdout.write(f"{path}\n")
            return EXIT_OK
    except (ScenarioError, ModelNotFoundError, ModelLoadError) as exc:
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
    scenario = load_scenario(args.scenario)
    options = CheckpointOptions(
        interval=args.checkpoint_interval,
        ram_budget=args.ram_budget << 20 if args.ram_budget is not None else None,
        disk_dir=data_dirs().cache / "checkpoints" if args.disk_tier else None,
    )
    report = replay(
        scenario, model=args.model, cache=CacheMode(args.cache), checkpoints=options,
        db=args.db,
    )
    text = json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    if args.report:
        args.report.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _print_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
