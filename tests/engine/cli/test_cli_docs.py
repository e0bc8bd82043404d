"""docs/cli.md is what `python -m engine.cli.docs` writes from the parser now: an option
added, renamed or re-explained without regenerating the page fails here. No model."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.cli.docs import markdown
from engine.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "cli.md"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_page_is_what_the_generator_writes_from_the_parser_now() -> None:
    assert PAGE.read_text(encoding="utf-8") == markdown(), (
        "docs/cli.md is stale: run `python -m engine.cli.docs > docs/cli.md`")


def test_every_subcommand_and_every_option_is_on_the_page() -> None:
    page = markdown()
    for name, sub in _subparsers(build_parser()).items():
        assert f"## `arbor-engine {name}`" in page
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page, f"{name} {option}"


def test_a_new_option_changes_the_page() -> None:
    parser = build_parser()
    before = markdown(parser)
    _subparsers(parser)["serve"].add_argument("--shiny", type=int, default=7,
                                              help="a new knob")
    after = markdown(parser)
    assert after != before
    assert "- `--shiny SHINY`: a new knob. (default: `7`)" in after


def test_the_page_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    wide = markdown()
    monkeypatch.setenv("COLUMNS", "30")  # argparse's own help would wrap at this width
    assert markdown() == wide
