"""Session files: whole trees out and in, checkpoints bound to identity and this
installation's key, and hostile files rejected with one clear message and no change."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import tracemalloc
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.records import from_tree
from engine.core.tree import Role, Tree
from engine.files.regular import FormatError
from engine.storage.checkpoints import PARTIAL_ONLY, Checkpoint, Identity
from engine.storage.formats import arbor_file as native
from engine.storage.formats.arbor_file import SessionCheckpoint, read_session, write_session
from engine.storage.store import Store
from engine.storage.transfer import FileFormat, export_file, import_file

ROOT = Path(__file__).resolve().parents[3]
IDENTITY = Identity(
    model_sha256="a" * 64, llama_cpp_python="0.3.36", n_ctx=1024, n_batch=64,
    type_k="f16", type_v="f16", flash_attn="off", swa_full=False,
)
KEY = b"k" * 32


def _branchy_tree() -> Tree:
    tree = Tree("Be helpful.")
    q1 = tree.add_child(tree.root_id, Role.USER, "What is an oak? \u00e9\u6f22\U0001f333")
    tree.add_child(q1.id, Role.ASSISTANT, "A tree.").tokens = (5, 6, 7)
    tree.add_child(tree.active_leaf, Role.USER, "How old?")
    tree.add_child(tree.active_leaf, Role.ASSISTANT, "Centuries.")
    q1b = tree.add_sibling(q1.id, "What is a river?")
    tree.add_child(q1b.id, Role.ASSISTANT, "Water that flows.")
    tree.switch_variant(q1.id, 0)
    return tree


def _shape(tree: Tree) -> tuple[Any, ...]:
    def walk(node_id: int) -> tuple[Any, ...]:
        node = tree.node(node_id)
        return (node.role.value, node.text, node.tokens, tuple(walk(c) for c in node.children))

    return walk(tree.root_id), tuple(n.text for n in tree.messages())


def _write(tmp_path: Path, **kwargs: Any) -> Path:
    path = tmp_path / "out.arbor"
    write_session(path, [from_tree(_branchy_tree(), title="Oaks")], key=KEY, **kwargs)
    return path


def test_native_round_trip_keeps_every_branch_and_the_active_leaf(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with Store(db) as store:
        cid = store.create(_branchy_tree(), title="Oaks")
        export_file(store, [cid], tmp_path / "x.arbor", FileFormat.NATIVE)
        result = import_file(tmp_path / "x.arbor", store)
        assert result.titles == ["Oaks"]
        assert _shape(store.load(result.conversation_ids[0])) == _shape(store.load(cid))
        # native -> import -> export -> import yields the same tree again
        export_file(store, result.conversation_ids, tmp_path / "y.arbor", FileFormat.NATIVE)
        again = import_file(tmp_path / "y.arbor", store)
        assert _shape(store.load(again.conversation_ids[0])) == _shape(store.load(cid))


def test_chatgpt_round_trip_through_the_store(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as store:
        cid = store.create(_branchy_tree(), title="Oaks")
        export_file(store, [cid], tmp_path / "conversations.json", FileFormat.CHATGPT)
        result = import_file(tmp_path / "conversations.json", store)
        imported = store.load(result.conversation_ids[0])
        original = store.load(cid)
        strip = lambda shape: json.dumps(shape).replace("[5, 6, 7]", "null")  # noqa: E731
        assert strip(_shape(imported)) == strip(_shape(original))  # ChatGPT has no tokens


def test_markdown_and_openai_exports_hold_the_active_branch(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as store:
        cid = store.create(_branchy_tree(), title="Oaks")
        export_file(store, [cid], tmp_path / "b.md", FileFormat.MARKDOWN)
        export_file(store, [cid], tmp_path / "b.json", FileFormat.OPENAI)
    markdown = (tmp_path / "b.md").read_text()
    assert "What is an oak?" in markdown and "Centuries." in markdown
    assert "What is a river?" not in markdown
    messages = json.loads((tmp_path / "b.json").read_text())["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]


def test_checkpoints_travel_only_to_the_same_identity_and_installation(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tokens=(1, 2, 3), blob=bytearray(b"state" * 100), bounds=(3,))
    path = _write(tmp_path, checkpoints=[SessionCheckpoint(0, checkpoint, IDENTITY)])
    ok = read_session(path, identity=IDENTITY, key=KEY)
    assert len(ok.checkpoints) == 1 and ok.dropped_checkpoints == 0
    assert ok.checkpoints[0].checkpoint.blob == checkpoint.blob
    other_model = read_session(path, identity=replace(IDENTITY, model_sha256="b" * 64), key=KEY)
    other_ctx = read_session(path, identity=replace(IDENTITY, n_ctx=2048), key=KEY)
    other_install = read_session(path, identity=IDENTITY, key=b"z" * 32)
    for contents in (other_model, other_ctx, other_install):
        assert contents.checkpoints == [] and contents.dropped_checkpoints == 1
        assert len(contents.conversations) == 1  # the conversation itself still imports


def test_a_checkpoint_without_its_chunk_ends_is_dropped(tmp_path: Path) -> None:
    """Files from before the decode schedule: their state may have been split elsewhere
    than this version splits the same path, so it is never restored."""
    old = Checkpoint(tokens=(1, 2, 3), blob=bytearray(b"state" * 100))
    path = _write(tmp_path, checkpoints=[SessionCheckpoint(0, old, IDENTITY)])
    contents = read_session(path, identity=IDENTITY, key=KEY)
    assert contents.checkpoints == [] and contents.dropped_checkpoints == 1
    assert len(contents.conversations) == 1


def test_a_partial_checkpoint_in_a_file_is_dropped(tmp_path: Path) -> None:
    """A partial state (a hybrid's recurrent part) needs the live cache of the context that
    made it: the engine never exports one, and one in a file, even signed, is never used."""
    partial = Checkpoint(tokens=(1, 2, 3), blob=bytearray(b"state" * 100), bounds=(3,),
                         flags=PARTIAL_ONLY)
    path = _write(tmp_path, checkpoints=[SessionCheckpoint(0, partial, IDENTITY)])
    contents = read_session(path, identity=IDENTITY, key=KEY)
    assert contents.checkpoints == [] and contents.dropped_checkpoints == 1
    assert len(contents.conversations) == 1


def test_a_forged_checkpoint_with_a_recomputed_checksum_is_dropped(tmp_path: Path) -> None:
    """Someone edits the blob and fixes the sha256s: only the HMAC tag can tell."""
    checkpoint = Checkpoint(tokens=(1, 2, 3), blob=bytearray(b"state" * 100), bounds=(3,))
    path = _write(tmp_path, checkpoints=[SessionCheckpoint(0, checkpoint, IDENTITY)])
    members = _members(path)
    members["checkpoints/0.bin"] = b"evil" * 125
    header = json.loads(members["checkpoints/0.json"])
    import hashlib

    header["sha256"] = hashlib.sha256(members["checkpoints/0.bin"]).hexdigest()
    members["checkpoints/0.json"] = json.dumps(header).encode()
    _rewrite(path, members)
    contents = read_session(path, identity=IDENTITY, key=KEY)
    assert contents.checkpoints == [] and contents.dropped_checkpoints == 1


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _rewrite(
    path: Path, members: dict[str, bytes], *, fix_manifest: bool = True, stored: bool = False
) -> None:
    import hashlib

    if fix_manifest:
        manifest = json.loads(members["manifest.json"])
        manifest["members"] = {
            n: hashlib.sha256(d).hexdigest() for n, d in members.items() if n != "manifest.json"
        }
        members["manifest.json"] = json.dumps(manifest).encode()
    buffer = io.BytesIO()
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    path.write_bytes(buffer.getvalue())


def _conversation(path: Path) -> dict[str, Any]:
    return json.loads(_members(path)["conversations/0.json"])


def _with_conversation(path: Path, change: Any) -> None:
    members = _members(path)
    conversation = json.loads(members["conversations/0.json"])
    change(conversation)
    members["conversations/0.json"] = json.dumps(conversation).encode()
    _rewrite(path, members)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_bytes(b"PK\x03\x04 not really a zip"), "not a valid zip"),
        (lambda p: p.write_bytes(p.read_bytes()[:200]), "not a valid zip"),
        (lambda p: _rewrite(p, {"manifest.json": b"{}"}, fix_manifest=False),
         "does not describe an Arbor session"),
        (lambda p: _rewrite(p, {**_members(p), "../evil.json": b"{}"}, fix_manifest=False),
         "unexpected member"),
        (lambda p: _rewrite(p, {**_members(p), "extra/x.json": b"{}"}, fix_manifest=False),
         "unexpected member"),
        (lambda p: _rewrite(p, {**_members(p), "conversations/0.json": b'{"a":1}'},
                            fix_manifest=False), "damaged"),
        (lambda p: _with_conversation(p, lambda c: c["nodes"][2].update(parent="999")),
         "missing parent"),
        (lambda p: _with_conversation(p, lambda c: c["nodes"][1].update(parent=c["nodes"][2]["id"])
                                      or c["nodes"][2].update(parent=c["nodes"][1]["id"])),
         "cycle"),
        (lambda p: _with_conversation(p, lambda c: c["nodes"].append(dict(c["nodes"][1]))),
         "appears twice"),
        (lambda p: _with_conversation(p, lambda c: c["nodes"][1].update(role="wizard")),
         "unknown role"),
        (lambda p: _with_conversation(p, lambda c: c["nodes"][1].update(parent=None)),
         "2 roots"),
        (lambda p: _with_conversation(p, lambda c: c.update(active_leaf="nope")),
         "active message does not exist"),
        (lambda p: _rewrite(p, {**_members(p), "conversations/0.json":
                                b'{"title": "x", "title": "y"}'}), "key 'title' twice"),
        (lambda p: _rewrite(p, {**_members(p), "conversations/0.json": b"[" * 5000 + b"]" * 5000},
                            stored=True), "deeper than 32 levels"),
        (lambda p: _rewrite(p, {**_members(p), "conversations/0.json":
                                b'{"title": "\\ud800"}'}), "surrogate"),
        (lambda p: _rewrite(p, {**_members(p), "conversations/0.json": b'{"created": NaN}'}),
         "NaN"),
    ],
)
def test_hostile_session_files_are_rejected_and_change_nothing(
    tmp_path: Path, damage: Any, message: str
) -> None:
    path = _write(tmp_path)
    damage(path)
    with Store(tmp_path / "a.db") as store:
        before = store.list()
        with pytest.raises(FormatError, match=message):
            import_file(path, store)
        assert store.list() == before
        assert store.integrity_ok()


def test_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    path = _write(tmp_path)
    members = _members(path)
    members["conversations/0.json"] = b" " * (64 << 20)  # 64 MiB of spaces: ~64 KiB zipped
    _rewrite(path, members)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(FormatError, match="zip bomb"):
        read_session(path)


def test_import_is_all_or_nothing_across_conversations(tmp_path: Path) -> None:
    good = from_tree(_branchy_tree(), title="good")
    path = tmp_path / "two.arbor"
    write_session(path, [good, good], key=KEY)
    _with_second_broken = _members(path)
    second = json.loads(_with_second_broken["conversations/1.json"])
    second["nodes"][3]["parent"] = "missing"
    _with_second_broken["conversations/1.json"] = json.dumps(second).encode()
    _rewrite(path, _with_second_broken)
    with Store(tmp_path / "a.db") as store:
        with pytest.raises(FormatError, match="conversation 'good'"):
            import_file(path, store)
        assert store.list() == []


def test_cli_export_and_import(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with Store(db) as store:
        cid = store.create(_branchy_tree(), title="Oaks")
    out = tmp_path / "oaks.arbor"
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "engine", *a], cwd=ROOT, capture_output=True, text=True,
        env={**__import__("os").environ, "ARBOR_HOME": str(tmp_path / "home")},
    )
    exported = run("export", "--db", str(db), "--conversation", str(cid), str(out))
    assert exported.returncode == 0, exported.stderr
    imported = run("import", str(out), "--db", str(db))
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith("imported conversation 2: Oaks")
    bad = tmp_path / "bad.arbor"
    bad.write_bytes(b"PK\x03\x04garbage")
    rejected = run("import", str(bad), "--db", str(db))
    assert rejected.returncode == 2
    assert len(rejected.stderr.strip().splitlines()) == 1
    assert "not a valid zip" in rejected.stderr and "Traceback" not in rejected.stderr


# --- fuzz --------------------------------------------------------------------------------------

_MUTATIONS = st.lists(
    st.tuples(st.sampled_from(["flip", "truncate", "insert", "member"]),
              st.integers(0, 1 << 30), st.integers(0, 255)),
    min_size=1, max_size=4,
)


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=_MUTATIONS)
def test_fuzzed_session_files_only_ever_raise_the_typed_error(
    tmp_path_factory: pytest.TempPathFactory, mutations: list[tuple[str, int, int]]
) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    checkpoint = Checkpoint(tokens=(1, 2), blob=bytearray(b"s" * 64), bounds=(2,))
    path = tmp / "f.arbor"
    write_session(path, [from_tree(_branchy_tree(), title="t")],
                  [SessionCheckpoint(0, checkpoint, IDENTITY)], key=KEY)
    # Member-level damage first (it needs a readable zip), then raw byte damage.
    for kind, where, value in sorted(mutations, key=lambda m: m[0] != "member"):
        if kind == "member":
            # Damage a member's content and fix the checksums, so parsing is reached.
            members = _members(path)
            name = sorted(members)[where % len(members)]
            data = bytearray(members[name]) or bytearray(b" ")
            data[where % len(data)] = value
            members[name] = bytes(data)
            _rewrite(path, members, fix_manifest=name != "manifest.json")
            continue
        data = bytearray(path.read_bytes())
        if not data:
            break
        if kind == "flip":
            data[where % len(data)] ^= 1 << (value % 8)
        elif kind == "truncate":
            data = data[: where % len(data)]
        else:
            data[where % (len(data) + 1):where % (len(data) + 1)] = bytes([value]) * 7
        path.write_bytes(bytes(data))
    with Store(tmp / "a.db") as store:
        try:
            import_file(path, store, identity=IDENTITY)
        except FormatError:
            assert store.list() == []
        else:
            assert len(store.list()) == 1
        assert store.integrity_ok()


def test_random_bytes_are_not_a_session_file(tmp_path: Path) -> None:
    rng = random.Random(5)
    path = tmp_path / "r.arbor"
    for _ in range(20):
        path.write_bytes(b"PK" + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 500))))
        with pytest.raises(FormatError):
            read_session(path)


# --- hostile input, round two ------------------------------------------------------------------


@pytest.mark.parametrize("method", [zipfile.ZIP_LZMA, zipfile.ZIP_BZIP2])
def test_members_compressed_other_than_stored_or_deflated_are_refused(
    tmp_path: Path, method: int
) -> None:
    path = _write(tmp_path)
    members = _members(path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data, method if name.startswith("conv") else None)
    path.write_bytes(buffer.getvalue())
    with Store(tmp_path / "a.db") as store, pytest.raises(
        FormatError, match="only stored and deflated"
    ):
        import_file(path, store)


def test_a_checkpoint_tag_that_is_not_hex_is_a_format_error(tmp_path: Path) -> None:
    """hmac.compare_digest raises TypeError on a str with a non-ASCII character."""
    checkpoint = Checkpoint(tokens=(1, 2, 3), blob=bytearray(b"state" * 100), bounds=(3,))
    path = _write(tmp_path, checkpoints=[SessionCheckpoint(0, checkpoint, IDENTITY)])
    members = _members(path)
    header = json.loads(members["checkpoints/0.json"])
    header["tag"] = "\u00e9" * 64
    members["checkpoints/0.json"] = json.dumps(header).encode()
    _rewrite(path, members)
    with pytest.raises(FormatError, match="tag"):
        read_session(path, identity=IDENTITY, key=KEY)


def _patch_central_directory(data: bytes, name: bytes, *, compress_size: int) -> bytes:
    """The zip with `name`'s compressed size in the central directory set to a lie."""
    at = 0
    while True:
        at = data.index(b"PK\x01\x02", at)
        name_length = int.from_bytes(data[at + 28:at + 30], "little")
        if data[at + 46:at + 46 + name_length] == name:
            break
        at += 4
    return data[:at + 20] + compress_size.to_bytes(4, "little") + data[at + 24:]


def test_a_zip_bomb_behind_a_lying_directory_stops_at_the_bytes_read(tmp_path: Path) -> None:
    """The directory claims a compressed size that passes a ratio check; the bytes do not.

    Bound: a member never inflates past MAX_RATIO times the compressed bytes actually read
    (before, all 64 MiB were inflated and the file was accepted)."""
    path = _write(tmp_path)
    members = _members(path)
    conversation = members["conversations/0.json"]
    members["conversations/0.json"] = conversation + b" " * (64 << 20)  # valid JSON, 64 MiB
    _rewrite(path, members)
    path.write_bytes(_patch_central_directory(path.read_bytes(), b"conversations/0.json",
                                              compress_size=1 << 20))
    size = path.stat().st_size
    assert size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="zip bomb"):
            read_session(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # What was inflated (a bytearray grows by up to 1/8 more than it holds) and a chunk.
    assert peak < 1.25 * native.MAX_RATIO * size + (1 << 20)


def test_members_are_read_one_at_a_time(tmp_path: Path) -> None:
    """Checkpoints that cannot be used here are checked as they stream by, never held:
    besides what it returns, reading holds one JSON member and a chunk at a time."""
    blob = bytearray(b"\x01\x02\x03\x04" * (1 << 20))  # 4 MiB each, stored
    checkpoints = [
        SessionCheckpoint(0, Checkpoint(tokens=(1, i), blob=blob, bounds=(2,)), IDENTITY)
        for i in range(4)
    ]
    path = _write(tmp_path, checkpoints=checkpoints)
    del blob, checkpoints
    tracemalloc.start()
    try:
        contents = read_session(path, identity=None, key=KEY)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert contents.dropped_checkpoints == 4
    assert peak < 2 << 20


@pytest.fixture
def no_hang() -> Any:
    """A safety net, not a timing assertion: a regression that blocks on a FIFO fails the
    test instead of hanging the suite."""

    def fail(signum: int, frame: Any) -> None:
        raise TimeoutError("blocked reading a file that is not a regular file")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("name", ["x.arbor", "conversations.json"])
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, no_hang: None, name: str) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    with Store(tmp_path / "a.db") as store, pytest.raises(FormatError, match="regular file"):
        import_file(fifo, store)
    with pytest.raises(FormatError, match="regular file"):
        read_session(fifo)


def test_a_device_is_refused_without_reading_it(tmp_path: Path, no_hang: None) -> None:
    """`st_size` of /dev/zero is 0: a size check before reading lets it read forever."""
    with Store(tmp_path / "a.db") as store, pytest.raises(FormatError, match="regular file"):
        import_file(Path("/dev/zero"), store)


def test_a_messages_documents_travel_in_a_session_file(tmp_path: Path) -> None:
    from engine.core.attachments import DOCUMENTS, Document, DocumentKind, documents_of

    tree = Tree("S")
    user = tree.add_child(tree.root_id, Role.USER, "Summarise.")
    document = Document("report.pdf", DocumentKind.PDF, "[page 1]\nHello", "ab" * 32, 1234)
    user.meta[DOCUMENTS] = [document.to_meta()]
    with Store(tmp_path / "a.db") as store:
        cid = store.create(tree, title="Doc")
        export_file(store, [cid], tmp_path / "x.arbor", FileFormat.NATIVE)
        result = import_file(tmp_path / "x.arbor", store)
        back = store.load(result.conversation_ids[0])
        (node,) = [n for n in back.nodes() if n.role is Role.USER]
        assert documents_of(node.meta) == (document,)
