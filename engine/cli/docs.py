"""docs/cli.md, written from the command line's own parser: the reference cannot drift.

It walks `engine.cli.main.build_parser()` and every subcommand, and writes each one's usage,
what it does, and its arguments with their defaults and choices. A test compares the page
with what this writes now, so a new option without `python -m engine.cli.docs > docs/cli.md`
fails `make test`.

    python -m engine.cli.docs > docs/cli.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from engine.cli.main import build_parser

WIDTH = 96  # of the usage blocks: fixed, so the page does not depend on the terminal


def markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole reference page: the program's usage and options, then each subcommand
    (sorted by name) with its usage, what it does, its arguments and its options. `-h` is
    left out: every command has it."""
    parser = parser or build_parser()
    lines = [
        "# Command line reference: `arbor-engine`",
        "",
        "<!-- Generated from engine/cli/main.py by `python -m engine.cli.docs > docs/cli.md`;"
        " do not edit. -->",
        "",
        "`arbor-engine` (also `python -m engine`) does headless everything the window does to a",
        "conversation, and runs the local API, the benchmark and RPC workers. How to use it,",
        "with examples: [the guide](guide.md#the-command-line); the API it serves:",
        "[api.md](api.md); what the benchmark measured: [benchmark.md](benchmark.md).",
        "",
    ]
    lines += _section(parser)
    for _name, sub, summary in _subcommands(parser):
        lines += [f"## `{sub.prog}`", ""]
        if summary:
            lines += [_sentence(summary), ""]
        lines += _section(sub, title=False)
    return "\n".join(lines).rstrip("\n") + "\n"


def _section(parser: argparse.ArgumentParser, *, title: bool = True) -> list[str]:
    lines = ["```", _usage(parser), "```", ""]
    if title and parser.description:
        lines += [_paragraphs(parser.description), ""]
    positionals = [a for a in _shown(parser) if not a.option_strings]
    options = [a for a in _shown(parser) if a.option_strings]
    if positionals:
        lines += ["Arguments:", ""] + [_item(parser, a) for a in positionals] + [""]
    if options:
        lines += ["Options:", ""] + [_item(parser, a) for a in options] + [""]
    return lines


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _shown(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(
                action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        yield action


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, one-line help) of each subcommand, sorted by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name in sorted(action.choices):
                yield name, action.choices[name], helps.get(name, "")


def _item(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.option_strings:
        metavar = _metavar(action)
        names = ", ".join(f"`{o}{' ' + metavar if metavar else ''}`"
                          for o in action.option_strings)
    else:
        names = f"`{_metavar(action) or action.dest}`"
    parts = []
    if action.help:
        parts.append(_sentence(_expand(parser, action)))
    facts = []
    if action.choices is not None and not action.option_strings:
        facts.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    if action.required and action.option_strings:
        facts.append("required")
    if isinstance(action, argparse._AppendAction):
        facts.append("may be repeated")
    if _has_default(action) and "default" not in (action.help or ""):
        facts.append(f"default: `{action.default}`")
    if facts:
        parts.append(f"({'; '.join(facts)})")
    return f"- {names}" + (": " + " ".join(parts) if parts else "")


def _has_default(action: argparse.Action) -> bool:
    """A default worth saying: not a flag's, not None or empty."""
    default = action.default
    return (action.nargs != 0 and default is not None and default is not argparse.SUPPRESS
            and default not in ([], ()) and not isinstance(default, bool))


def _metavar(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _expand(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text with argparse's `%(default)s`-style fields filled in, as --help does."""
    params = dict(vars(action), prog=parser.prog)
    text = action.help or ""
    return text % params if "%" in text else text


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text + ("" if text.endswith(".") else ".")


def _paragraphs(text: str) -> str:
    return "\n\n".join(" ".join(p.split()) for p in text.strip().split("\n\n"))


def main() -> int:
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
