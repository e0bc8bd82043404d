"""docs/benchmark.md's figures, rendered from the benchmark's own results, never copied.

The page is prose written by hand around generated parts. Each generated part sits between
a begin line naming its source (a results.json under resources/bench/) and an end line; its
body is `engine.bench.main.results_markdown` of that file, the renderer that writes
results.md after a run. So a new run's results.json, committed, changes the page's tables
with one command, and a test fails while the page still shows the old ones.

    python -m engine.bench.docs            # rewrite the generated parts of docs/benchmark.md
    python -m engine.bench.docs --check    # exit 1 if they are not what the sources give
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from engine.bench.main import results_markdown

ROOT = Path(__file__).resolve().parents[2]
PAGE = Path("docs/benchmark.md")
HEADING = "###"  # the generated reports sit under the page's own sections
END = "<!-- end of generated part -->"
_BEGIN = re.compile(r"^<!-- generated from (?P<source>\S+) by `python -m engine\.bench\.docs`: "
                    r"do not edit -->$", re.MULTILINE)


def begin_line(source: str) -> str:
    """The line that opens a generated part rendered from `source` (relative to the root)."""
    return f"<!-- generated from {source} by `python -m engine.bench.docs`: do not edit -->"


def render(page: str, root: Path = ROOT) -> str:
    """`page` with every generated part rendered again from its source."""
    out: list[str] = []
    position = 0
    for match in _BEGIN.finditer(page):
        if match.start() < position:
            continue
        end = page.find(END, match.end())
        if end < 0:
            raise ValueError(f"a generated part from {match['source']} has no end line")
        data = json.loads((root / match["source"]).read_text(encoding="utf-8"))
        body = results_markdown(data, heading=HEADING).rstrip("\n")
        out += [page[position:match.end()], "\n\n", body, "\n\n"]
        position = end
    out.append(page[position:])
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench.docs",
                                     description="Render docs/benchmark.md's generated parts.")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if the page is stale")
    args = parser.parse_args(argv)
    path = ROOT / PAGE
    current = path.read_text(encoding="utf-8")
    fresh = render(current)
    if args.check:
        if fresh != current:
            sys.stderr.write(f"{PAGE} is stale: run python -m engine.bench.docs\n")
            return 1
        return 0
    if fresh != current:
        path.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
