"""Import in two steps: `parse_import` (any thread, no store) and `commit_import` (the store's
thread, one transaction). `import_file` is the two together."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.core.errors import ArborError, Cancelled
from engine.core.records import ConversationRecord, from_tree
from engine.core.tree import Role, Tree
from engine.files.regular import FormatError
from engine.storage.formats.arbor_file import write_session
from engine.storage.formats.chatgpt_export import export_chatgpt
from engine.storage.formats.openai_messages import export_openai_messages
from engine.storage.store import Store
from engine.storage.transfer import ParsedImport, commit_import, import_file, parse_import


def _record(title: str = "Oaks") -> ConversationRecord:
    tree = Tree("Be brief.")
    question = tree.add_child(tree.root_id, Role.USER, "What is an oak?")
    tree.add_child(question.id, Role.ASSISTANT, "A tree.")
    tree.add_sibling(question.id, "What is a river?")
    return from_tree(tree, title=title)


def _texts(store: Store, conversation_id: int) -> list[str]:
    return [node.text for node in store.load(conversation_id).messages()]


@pytest.mark.parametrize("kind", ["chatgpt", "arbor", "openai"])
def test_parse_needs_no_store_and_commit_writes_it(
    tmp_path: Path, _arbor_home: Path, kind: str
) -> None:
    path = tmp_path / f"in.{kind}"
    if kind == "chatgpt":
        path.write_bytes(export_chatgpt([_record("Oaks"), _record("Rivers")]))
    elif kind == "arbor":
        write_session(path, [_record("Oaks"), _record("Rivers")], key=b"k" * 32)
    else:
        path.write_bytes(export_openai_messages(_record()))
    contents = parse_import(path)
    assert not _arbor_home.exists()  # no database (nor anything else) was created
    expected = ["Untitled"] if kind == "openai" else ["Oaks", "Rivers"]
    assert [record.title for record in contents.conversations] == expected

    with Store(tmp_path / "a.db") as store:
        result = commit_import(contents, store)
        assert result.titles == expected
        assert [info.title for info in store.list()] == list(reversed(expected))
        assert _texts(store, result.conversation_ids[0]) == ["What is a river?"]


def test_parse_and_commit_may_run_on_different_threads(tmp_path: Path) -> None:
    path = tmp_path / "conversations.json"
    path.write_bytes(export_chatgpt([_record()]))
    parsed: list[ParsedImport] = []
    worker = threading.Thread(target=lambda: parsed.append(parse_import(path)))
    worker.start()
    worker.join()
    with Store(tmp_path / "a.db") as store:  # the store is opened and used on this thread
        (cid,) = commit_import(parsed[0], store).conversation_ids
        assert _texts(store, cid) == ["What is a river?"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[]", "holds no conversations"),
        (b"", "is not a session file"),
        (b'["unterminated', "not valid JSON"),
        (b"PK\x03\x04 not a zip", "not a valid zip"),
        (b'{"messages": [{"role": "robot", "content": "x"}]}',
         "only system, user, assistant and tool"),
        (b"\x00\x01binary", "is not a session file"),
    ],
)
def test_rejected_files_raise_one_line_arbor_errors_and_change_nothing(
    tmp_path: Path, data: bytes, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    with pytest.raises(FormatError, match=message) as caught:
        parse_import(path)
    assert "\n" not in str(caught.value)
    with Store(tmp_path / "a.db") as store:
        with pytest.raises(FormatError, match=message):
            import_file(path, store)
        assert store.list() == []


def test_a_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=r"cannot read gone\.json"):
        parse_import(tmp_path / "gone.json")


def test_a_cancelled_parse_raises_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "conversations.json"
    path.write_bytes(export_chatgpt([_record()]))
    cancel = threading.Event()
    assert parse_import(path, cancel=cancel).conversations  # not set: reads as usual
    cancel.set()
    with pytest.raises(Cancelled) as caught:
        parse_import(path, cancel=cancel)
    assert isinstance(caught.value, ArborError)


def test_commit_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "conversations.json"
    path.write_bytes(export_chatgpt([_record("first"), _record("second")]))
    parsed = parse_import(path)
    real = Store._insert_new_nodes
    calls: list[int] = []

    def fail_on_the_second(db: sqlite3.Connection, cid: int, nodes: Any) -> None:
        calls.append(cid)
        if len(calls) == 2:
            raise sqlite3.OperationalError("disk I/O error")
        real(db, cid, nodes)

    with Store(tmp_path / "a.db") as store:
        before = store.list()
        monkeypatch.setattr(Store, "_insert_new_nodes", staticmethod(fail_on_the_second))
        with pytest.raises(ArborError):
            commit_import(parsed, store)
        assert len(calls) == 2
        assert store.list() == before
        assert store.integrity_ok()


def test_commit_of_the_same_contents_twice_adds_two_copies(tmp_path: Path) -> None:
    path = tmp_path / "conversations.json"
    path.write_bytes(export_chatgpt([_record()]))
    contents = parse_import(path)
    with Store(tmp_path / "a.db") as store:
        first = commit_import(contents, store).conversation_ids
        second = commit_import(contents, store).conversation_ids
        assert first != second
        assert _texts(store, first[0]) == _texts(store, second[0])


def test_a_chatgpt_export_with_a_byte_order_mark_is_imported(tmp_path: Path) -> None:
    """Windows editors save UTF-8 with a BOM; it was refused as "not a ChatGPT export"."""
    path = tmp_path / "conversations.json"
    path.write_bytes(b"\xef\xbb\xbf" + export_chatgpt([_record()]))
    with Store(tmp_path / "a.db") as store:
        result = import_file(path, store)
        assert result.titles == ["Oaks"]
