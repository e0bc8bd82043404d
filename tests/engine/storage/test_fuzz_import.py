"""Fuzzed imports through `engine.storage.transfer`: session files (every zip compression method,
lying
central directories, byte damage), ChatGPT exports and OpenAI messages (structural JSON
mutations). Only FormatError escapes, and a rejected import leaves the database byte for byte
as it was (compared as an SQL dump)."""

from __future__ import annotations

import copy
import io
import json
import sqlite3
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.records import ConversationRecord, from_tree
from engine.core.tree import Role, Tree
from engine.files.regular import FormatError
from engine.storage.formats.arbor_file import write_session
from engine.storage.formats.chatgpt_export import export_chatgpt
from engine.storage.formats.openai_messages import export_openai_messages
from engine.storage.store import Store
from engine.storage.transfer import import_file

METHODS = [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA]
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def _record() -> ConversationRecord:
    tree = Tree("Be brief.")
    question = tree.add_child(tree.root_id, Role.USER, "What is an oak? \u00e9\U0001f333")
    tree.add_child(question.id, Role.ASSISTANT, "A tree.").tokens = (5, 6)
    tree.add_sibling(question.id, "What is a river?")
    return from_tree(tree, title="Oaks")


def _dump(db: Path) -> list[str]:
    connection = sqlite3.connect(db)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


def _import_and_check(tmp: Path, path: Path) -> None:
    """Import `path` into a store holding one conversation: either it is added, or
    FormatError and the database is unchanged."""
    db = tmp / "a.db"
    with Store(db) as store:
        store.import_records([_record()])
    before = _dump(db)
    with Store(db) as store:
        try:
            import_file(path, store)
        except FormatError as error:
            assert "\n" not in str(error)
            rejected = True
        else:
            rejected = False
    if rejected:
        assert _dump(db) == before
    else:
        assert len(_dump(db)) > len(before)


def _session_members(tmp: Path) -> dict[str, bytes]:
    path = tmp / "base.arbor"
    write_session(path, [_record(), _record()])
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _patch_directory(data: bytearray, entry: int, field: int, value: int) -> None:
    """Overwrite a 4-byte field of the `entry`-th central directory record (16: CRC,
    20: compressed size, 24: uncompressed size, 42: local header offset)."""
    at = -1
    for _ in range(entry + 1):
        at = data.find(b"PK\x01\x02", at + 1)
        if at < 0:
            return
    data[at + field:at + field + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")


_DAMAGE = st.lists(
    st.tuples(st.sampled_from(["flip", "truncate", "insert", "directory"]),
              st.integers(0, 1 << 30), st.integers(0, 1 << 32)),
    max_size=3,
)


@FUZZ
@given(methods=st.lists(st.sampled_from(METHODS), min_size=4, max_size=4), damage=_DAMAGE)
def test_fuzzed_session_files(
    tmp_path_factory: pytest.TempPathFactory, methods: list[int],
    damage: list[tuple[str, int, int]],
) -> None:
    tmp = tmp_path_factory.mktemp("session")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for index, (name, data) in enumerate(sorted(_session_members(tmp).items())):
            archive.writestr(name, data, methods[index % len(methods)])
    data = bytearray(buffer.getvalue())
    for kind, where, value in damage:
        if not data:
            break
        if kind == "flip":
            data[where % len(data)] ^= 1 << (value % 8)
        elif kind == "truncate":
            data = data[: where % len(data)]
        elif kind == "insert":
            data[where % len(data):where % len(data)] = bytes([value % 256]) * 5
        else:
            _patch_directory(data, where % 4, [16, 20, 24, 42][value % 4], value >> 2)
    path = tmp / "f.arbor"
    path.write_bytes(bytes(data))
    _import_and_check(tmp, path)


# --- JSON formats ------------------------------------------------------------------------------

_JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 40), 1 << 40), st.floats(allow_nan=False,
    allow_infinity=False), st.text(max_size=8), st.just([]), st.just({}),
    st.sampled_from(["user", "assistant", "system", "tool", "critic", "text", "code"]),
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside `value`, containers included."""
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out.extend(_paths(item, (*prefix, index)))
    return out


def _mutate(document: Any, mutations: list[tuple[str, int, Any]]) -> Any:
    """Structural JSON mutations: replace a value, delete a key or item, duplicate an item."""
    document = copy.deepcopy(document)
    for kind, where, value in mutations:
        paths = [p for p in _paths(document) if p]
        if not paths:
            break
        path = paths[where % len(paths)]
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        if kind == "replace":
            parent[last] = value
        elif kind == "delete":
            del parent[last]
        elif isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
        else:
            parent[f"{last}-copy"] = copy.deepcopy(parent[last])
    return document


_MUTATIONS = st.lists(
    st.tuples(st.sampled_from(["replace", "delete", "duplicate"]), st.integers(0, 1 << 20),
              _JSON_VALUES),
    min_size=0, max_size=4,
)
_BASES = {
    "chatgpt": json.loads(export_chatgpt([_record(), _record()])),
    "openai": json.loads(export_openai_messages(_record())),
}


@FUZZ
@given(kind=st.sampled_from(sorted(_BASES)), mutations=_MUTATIONS, bom=st.booleans(),
       cut=st.one_of(st.none(), st.integers(0, 1 << 16)))
def test_fuzzed_json_exports(
    tmp_path_factory: pytest.TempPathFactory, kind: str, mutations: list[tuple[str, int, Any]],
    bom: bool, cut: int | None,
) -> None:
    tmp = tmp_path_factory.mktemp("json")
    data = json.dumps(_mutate(_BASES[kind], mutations)).encode()
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    path = tmp / "conversations.json"
    path.write_bytes(b"\xef\xbb\xbf" + data if bom else data)
    _import_and_check(tmp, path)


def test_unmutated_bases_import(tmp_path: Path) -> None:
    """The fuzz starts from files that import, so its mutations reach the checks."""
    for kind, document in _BASES.items():
        path = tmp_path / f"{kind}.json"
        path.write_bytes(json.dumps(document).encode())
        (tmp_path / "a.db").unlink(missing_ok=True)
        with Store(tmp_path / "a.db") as store:
            assert import_file(path, store).titles
