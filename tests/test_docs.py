"""The documentation's links and citations point at things that exist.

Every relative link and image in README.md and docs/*.md names a file of the repository (and,
with a #fragment, a heading of that page, by GitHub's anchor rule); every citation of a section
of a docs page in the code (`docs/architecture.md, "Memory kinds"`) names a heading of that
page; and no code cites a design file that is not in the repository. No model, no window.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
CODE = ("engine", "app", "tests", "installer")

_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CITATION = re.compile(r"docs/([\w-]+\.md),\s*\"([^\"]+)\"")


def anchors(page: Path) -> set[str]:
    """The #fragments GitHub gives the page's headings (duplicates numbered -1, -2...)."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE):
        slug = slugify(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def slugify(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    return [m.group(1) for m in _LINK.finditer(text)]


def test_the_pages_are_found() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "architecture.md", "testing.md", "cli.md", "api.md",
            "benchmark.md", "guide.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target}: no such heading in {file.name}")
    assert not broken, f"{page.name}: {broken}"


def test_the_anchor_rule_is_githubs() -> None:
    assert slugify("Gemma with `swa_full` on: the report") == "gemma-with-swa_full-on-the-report"
    assert slugify("Beyond one machine: llama.cpp RPC workers") == (
        "beyond-one-machine-llamacpp-rpc-workers")
    assert slugify("The engine's limits") == "the-engines-limits"


def _code_files() -> list[Path]:
    return sorted(f for folder in CODE for f in (ROOT / folder).rglob("*")
                  if f.suffix in (".py", ".sh", ".spec", ".ps1", ".iss") and f.is_file())


def test_code_cites_sections_of_the_docs_that_exist() -> None:
    """`(docs/architecture.md, "Memory kinds")` in a comment names a heading of that page."""
    cited: list[tuple[str, str, str]] = []
    for file in _code_files():
        text = file.read_text(encoding="utf-8", errors="replace")
        text = re.sub(r"\n\s*#?\s*", " ", text)  # a citation may wrap, in a comment too
        cited += [(file.name, m.group(1), m.group(2)) for m in _CITATION.finditer(text)]
    assert len(cited) >= 8, cited  # the walk found them
    missing = []
    for name, page, section in cited:
        path = ROOT / "docs" / page
        titles = {m.group(1).strip() for m in re.finditer(
            r"^#{1,6}\s+(.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
        } if path.exists() else set()
        if section not in titles:
            missing.append(f"{name}: docs/{page}, {section!r}")
    assert not missing, f"citations of sections the docs do not have: {missing}"


def test_no_code_cites_a_design_file_outside_the_repository() -> None:
    absent = [name + ".md" for name in ("DESIGN", "LESSONS", "STYLE")]
    found = [(file.relative_to(ROOT).as_posix(), name) for file in _code_files()
             for name in absent if name in file.read_text(encoding="utf-8", errors="replace")]
    assert not found, found
