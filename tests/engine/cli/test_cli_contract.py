"""The command line's contract: any bad input exits 2 with one line on stderr, no traceback,
values echoed short and printable, and nothing changed. Run as a user runs it (a subprocess
under a temporary ARBOR_HOME); no test here loads a model."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.records import from_tree
from engine.core.tree import Role, Tree
from engine.storage.formats.chatgpt_export import export_chatgpt
from engine.storage.store import DB_NAME, Store

ROOT = Path(__file__).resolve().parents[3]
LONGEST_LINE = 1000  # an error line's length bound, whatever the input echoed


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine", *map(str, args)], cwd=ROOT, capture_output=True,
        text=True, errors="surrogateescape",
    )


def _bad_input(result: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a rejected command (asserted to be exactly that)."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stderr.endswith("\n"), result.stderr
    assert len(lines[0]) <= LONGEST_LINE
    assert lines[0].startswith("arbor-engine")
    return lines[0]


def _tree() -> Tree:
    tree = Tree("Be brief.")
    question = tree.add_child(tree.root_id, Role.USER, "What is an oak?")
    tree.add_child(question.id, Role.ASSISTANT, "A tree")
    return tree


@pytest.fixture
def db_with_streaming_reply(tmp_path: Path) -> Path:
    """A database holding conversation 1, whose reply is still streaming (as while the app
    writes it)."""
    path = tmp_path / DB_NAME
    with Store(path, recover=False) as store:
        store.create(_tree(), title="Oaks")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE nodes SET status = 'streaming' WHERE role = 'assistant'")
    return path


def _statuses(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT status FROM nodes ORDER BY id")]


def test_export_to_a_directory_exits_2(db_with_streaming_reply: Path, tmp_path: Path) -> None:
    out = tmp_path / "folder"
    out.mkdir()
    line = _bad_input(_cli("export", "--db", db_with_streaming_reply, "--conversation", "1", out))
    assert str(out) in line
    assert list(out.iterdir()) == [] and [p.name for p in tmp_path.glob(".*")] == []


def test_export_to_an_unwritable_path_exits_2(
    db_with_streaming_reply: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = blocker / "out.arbor"  # its parent is a file: no one can write there
    line = _bad_input(_cli("export", "--db", db_with_streaming_reply, "--conversation", "1", out))
    assert "out.arbor" in line
    assert blocker.read_text() == "x"


def test_export_of_a_missing_conversation_exits_2(
    db_with_streaming_reply: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.arbor"
    line = _bad_input(
        _cli("export", "--db", db_with_streaming_reply, "--conversation", "999", out)
    )
    assert "999" in line
    assert not out.exists()


@pytest.mark.parametrize("command", ["export", "import"])
def test_a_database_name_too_long_exits_2(tmp_path: Path, command: str) -> None:
    db = tmp_path / ("d" * 300)
    source = tmp_path / "in.json"
    source.write_bytes(export_chatgpt([from_tree(_tree(), title="Oaks")]))
    args = (["--conversation", "1", tmp_path / "out.md"] if command == "export" else [source])
    line = _bad_input(_cli(command, "--db", db, *args))
    assert "d" * 50 in line


def test_a_deeply_nested_scenario_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"steps": ' + "[" * 100_000 + "]" * 100_000 + "}")
    line = _bad_input(_cli("replay", path, "--model", tmp_path / "missing.gguf"))
    assert "deep.json" in line


def test_a_scenario_that_is_a_fifo_exits_2_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    _bad_input(_cli("replay", path))


def test_a_file_name_with_a_newline_stays_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad\nname.json"
    path.write_text("not a conversation")
    line = _bad_input(_cli("import", "--db", tmp_path / "a.db", path))
    assert "bad\\nname.json" in line


def test_echoed_values_are_cut_short(tmp_path: Path) -> None:
    huge = "x" * 2_000_000
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"steps": [{"op": huge}]}))
    line = _bad_input(_cli("replay", path))
    assert "unknown op" in line and "x" * 100 in line
    _bad_input(_cli("export", "--conversation", "9" * 100_000, tmp_path / "out.md"))


def test_argument_errors_are_one_line() -> None:
    line = _bad_input(_cli("export", "out.md"))
    assert "--conversation" in line
    _bad_input(_cli("fly"))


def test_imported_titles_are_printed_without_terminal_escapes(tmp_path: Path) -> None:
    source = tmp_path / "in.json"
    titles = ["\x1b]0;owned\x07\x1b[31mRed", "two\nlines\u202e"]
    source.write_bytes(export_chatgpt([from_tree(_tree(), title=t) for t in titles]))
    result = _cli("import", "--db", tmp_path / "a.db", source)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert all(ch.isprintable() for line in lines for ch in line), lines
    assert "\\x1b[31mRed" in lines[0] and "two\\nlines" in lines[1]


def test_a_rejected_import_changes_nothing(db_with_streaming_reply: Path, tmp_path: Path) -> None:
    before = db_with_streaming_reply.read_bytes()
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    _bad_input(_cli("import", "--db", db_with_streaming_reply, bad))
    assert _statuses(db_with_streaming_reply) == ["complete", "complete", "streaming"]
    assert db_with_streaming_reply.read_bytes() == before
    fresh = tmp_path / "fresh.db"
    _bad_input(_cli("import", "--db", fresh, bad))
    assert not fresh.exists()  # no database was made for nothing


def test_export_leaves_a_streaming_reply_alone(
    db_with_streaming_reply: Path, tmp_path: Path
) -> None:
    """The app may be writing that reply at this moment: only the app's own start may mark
    it interrupted."""
    out = tmp_path / "out.md"
    result = _cli("export", "--db", db_with_streaming_reply, "--conversation", "1", out)
    assert result.returncode == 0, result.stderr
    assert out.exists()
    assert _statuses(db_with_streaming_reply) == ["complete", "complete", "streaming"]


@pytest.mark.parametrize("flag, value, named", [("--ctx-size", "10", "context"),
                                               ("--threads", "-3", "threads")])
def test_serve_refuses_a_context_or_thread_count_the_settings_refuse(
    flag: str, value: str, named: str, tmp_path: Path
) -> None:
    line = _bad_input(_cli("serve", "--db", tmp_path / "a.db", flag, value))
    assert named in line
    assert not (tmp_path / "a.db").exists()  # refused before anything was opened
