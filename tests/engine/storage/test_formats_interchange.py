"""Interchange formats: ChatGPT conversations.json, Markdown and OpenAI messages.

Imported files are hostile: every malformed file must end in a one-line FormatError, and a
file that is accepted must give records that pass `records.validate` and survive an export and
re-import with the same shape.
"""

from __future__ import annotations

import json
import re
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.core.records
from engine.core.errors import ArborError
from engine.core.records import ConversationRecord, from_tree, to_tree, validate
from engine.core.tools import TOOL_CALL_ID, TOOL_CALLS, TOOLS, ToolCall
from engine.core.tree import NodeStatus, Role, Tree
from engine.files.regular import FormatError
from engine.files.strict_json import dumps_strict, loads_strict
from engine.storage.formats import chatgpt_import
from engine.storage.formats.chatgpt_export import export_chatgpt
from engine.storage.formats.chatgpt_import import parse_chatgpt
from engine.storage.formats.markdown import export_markdown
from engine.storage.formats.openai_messages import export_openai_messages, parse_openai_messages

# --- building ChatGPT exports ----------------------------------------------------------------


def _message(
    node_id: str,
    role: str,
    parts: list[Any] | None = None,
    *,
    t: float | None = None,
    content: dict[str, Any] | None = None,
    hidden: bool = False,
    recipient: str = "all",
) -> dict[str, Any]:
    """A message as ChatGPT writes it (the fields Arbor ignores included, as in real files)."""
    return {
        "id": node_id,
        "author": {"role": role, "name": None, "metadata": {}},
        "create_time": t,
        "update_time": None,
        "content": content or {"content_type": "text", "parts": parts or [""]},
        "status": "finished_successfully",
        "end_turn": role == "assistant" or None,
        "weight": 1.0,
        "metadata": {"is_visually_hidden_from_conversation": True} if hidden else {},
        "recipient": recipient,
        "channel": None,
    }


def _node(
    node_id: str, message: dict[str, Any] | None, parent: str | None, children: list[str]
) -> dict[str, Any]:
    return {"id": node_id, "message": message, "parent": parent, "children": children}


def _edited_conversation() -> dict[str, Any]:
    """A real-looking conversation: a hidden system message, a user edit (two branches), the
    active one on the second branch, a code call, a tool reply and an image part."""
    code = {"content_type": "code", "language": "python", "text": "print('hello'[::-1])"}
    image = {"content_type": "image_asset_pointer", "asset_pointer": "file-service://f1"}
    mapping = [
        _node("client-created-root", None, None, ["sys"]),
        _node("sys", _message("sys", "system", [""], hidden=True), "client-created-root", ["u1"]),
        _node("u1", _message("u1", "user", ["How do I reverse a list?"], t=1000.0), "sys", ["a1"]),
        _node("a1", _message("a1", "assistant", ["Use reversed()."], t=1001.5), "u1", ["u2", "e2"]),
        _node("u2", _message("u2", "user", ["And a tuple?"], t=1002.0), "a1", ["a2"]),
        _node("a2", _message("a2", "assistant", ["Same way."], t=1003.0), "u2", []),
        _node("e2", _message("e2", "user", ["And a string?"], t=1004.0), "a1", ["call"]),
        _node(
            "call",
            _message("call", "assistant", t=1005.0, content=code, recipient="python"),
            "e2",
            ["tool"],
        ),
        _node("tool", _message("tool", "tool", ["olleh"], t=1006.0), "call", ["a3"]),
        _node(
            "a3",
            _message(
                "a3",
                "assistant",
                t=1007.0,
                content={
                    "content_type": "multimodal_text",
                    "parts": [image, "Slice it:", "'hello'[::-1] is 'olleh'."],
                },
            ),
            "tool",
            [],
        ),
    ]
    return {
        "title": "Reversing things",
        "create_time": 1000.0,
        "update_time": 1007.25,
        "mapping": {node["id"]: node for node in mapping},
        "moderation_results": [],
        "current_node": "a3",
        "plugin_ids": None,
        "conversation_id": "c-1",
        "id": "c-1",
    }


def _system_rooted_conversation() -> dict[str, Any]:
    """No null root: the root is a visible system prompt; current_node is a tool message."""
    mapping = [
        _node("s", _message("s", "system", ["You are terse."]), None, ["u"]),
        _node("u", _message("u", "user", ["Hi"]), "s", ["a", "t"]),
        _node("a", _message("a", "assistant", ["Hello."]), "u", []),
        _node("t", _message("t", "tool", ["search results"]), "u", []),
    ]
    return {
        "title": None,
        "create_time": None,
        "update_time": None,
        "mapping": {node["id"]: node for node in mapping},
        "current_node": "t",
    }


def _chain_conversation(length: int = 3) -> dict[str, Any]:
    """A root and `length` alternating messages, the last one active."""
    ids = [f"n{i}" for i in range(length + 1)]
    mapping = {"n0": _node("n0", None, None, ids[1:2])}
    for i in range(1, length + 1):
        role = "user" if i % 2 else "assistant"
        message = _message(ids[i], role, [f"message {i}"], t=float(i))
        mapping[ids[i]] = _node(ids[i], message, ids[i - 1], ids[i + 1 : i + 2])
    return {
        "title": "Chain",
        "create_time": 1.0,
        "update_time": 2.0,
        "mapping": mapping,
        "current_node": ids[-1],
    }


def _dump(conversations: list[Any]) -> bytes:
    return json.dumps(conversations).encode("utf-8")


SAMPLE = _dump([_edited_conversation(), _system_rooted_conversation()])


# --- comparing records -----------------------------------------------------------------------

Shape = tuple[str, str, str, bool, tuple[Any, ...]]


def _shape(record: ConversationRecord) -> tuple[str, Shape]:
    """The record up to ids: title, and per node role, text, status, whether it is on the
    active path, and its children in Arbor's sibling order."""
    tree = to_tree(record)
    active = {node.id for node in tree.active_path()}

    def build(node_id: int) -> Shape:
        node = tree.node(node_id)
        children = tuple(build(child) for child in node.children)
        return (node.role.value, node.text, node.status.value, node_id in active, children)

    return record.title, build(tree.root_id)


def _active_texts(record: ConversationRecord) -> list[str]:
    return [node.text for node in to_tree(record).active_path()]


def _by_id(record: ConversationRecord) -> dict[str, engine.core.records.NodeRecord]:
    return {node.id: node for node in record.nodes}


# --- the realistic sample --------------------------------------------------------------------


def test_sample_keeps_both_branches_and_the_active_one() -> None:
    edited, _ = parse_chatgpt(SAMPLE)
    validate(edited)
    nodes = _by_id(edited)
    assert set(nodes) == {"client-created-root", "u1", "a1", "u2", "a2", "e2", "a3"}
    assert edited.root.id == "client-created-root"
    assert edited.root.role is Role.SYSTEM and edited.root.text == ""
    assert edited.title == "Reversing things"
    assert (edited.created, edited.updated) == (1000.0, 1007.25)
    # The user's edit is a second child of the reply; the code call and tool reply are gone and
    # the final answer hangs under the edited question, its image part dropped.
    assert [n.id for n in edited.nodes if n.parent == "a1"] == ["u2", "e2"]
    assert nodes["a3"].parent == "e2"
    assert nodes["a3"].text == "Slice it:\n'hello'[::-1] is 'olleh'."
    assert nodes["u1"].parent == "client-created-root"
    assert nodes["a1"].created == 1001.5 and nodes["a1"].role is Role.ASSISTANT
    assert edited.active_leaf == "a3"
    tree = to_tree(edited)
    assert [n.text for n in tree.messages()] == [
        "How do I reverse a list?",
        "Use reversed().",
        "And a string?",
        "Slice it:\n'hello'[::-1] is 'olleh'.",
    ]
    first_branch = tree.switch_variant(tree.message(2).id, 0)
    assert [n.text for n in tree.path_to(first_branch)][-2:] == ["And a tuple?", "Same way."]


def test_visible_system_root_becomes_the_prompt_and_active_tool_moves_up() -> None:
    _, record = parse_chatgpt(SAMPLE)
    assert record.title == "Untitled"
    assert record.root.id == "s" and record.root.text == "You are terse."
    assert record.active_leaf == "u"  # current_node was the skipped tool message
    assert {n.id for n in record.nodes} == {"s", "u", "a"}
    assert record.created == 0.0 and all(n.created == 0.0 for n in record.nodes)


def test_a_user_message_at_the_top_gets_an_empty_system_root() -> None:
    mapping = {
        "u": _node("u", _message("u", "user", ["first"]), None, ["a"]),
        "a": _node("a", _message("a", "assistant", ["second"]), "u", ["root"]),
        "root": _node("root", _message("root", "tool", ["x"]), "a", []),
    }
    conversation = {"title": "T", "mapping": mapping, "current_node": "a"}
    (record,) = parse_chatgpt(_dump([conversation]))
    assert record.root.text == "" and record.root.id not in mapping
    assert _active_texts(record) == ["", "first", "second"]


def test_interrupted_replies_and_unknown_roles() -> None:
    conversation = _chain_conversation(2)
    conversation["mapping"]["n2"]["message"]["status"] = "finished_partial_completion"
    conversation["mapping"]["n1"]["children"] = ["n2", "x"]
    conversation["mapping"]["x"] = _node("x", _message("x", "critic", ["?"]), "n1", [])
    (record,) = parse_chatgpt(_dump([conversation]))
    assert _by_id(record)["n2"].status is NodeStatus.INTERRUPTED
    assert _by_id(record)["x"].role is Role.USER  # kept visibly, its role named
    assert _by_id(record)["x"].text == "[critic]\n?"


def test_an_empty_array_is_no_conversations() -> None:
    assert parse_chatgpt(b"[]") == []
    assert parse_chatgpt(b"\xef\xbb\xbf[]") == []  # a BOM from a Windows editor is harmless


# --- round trips -----------------------------------------------------------------------------


def _branched_tree() -> Tree:
    """Edits, regenerations, an interrupted reply, and the active path on a middle branch."""
    tree = Tree("Be kind.\nAnswer in one line.")
    u0 = tree.add_child(tree.root_id, Role.USER, "q1")
    a0 = tree.add_child(u0.id, Role.ASSISTANT, "r1")
    u1 = tree.add_child(a0.id, Role.USER, "q2")
    tree.add_child(u1.id, Role.ASSISTANT, "r2", status=NodeStatus.INTERRUPTED)
    edited = tree.add_sibling(u1.id, "q2 edited")
    tree.add_child(edited.id, Role.ASSISTANT, "r2 for the edit")
    regenerated = tree.add_sibling(a0.id, "r1 again")
    tree.add_child(regenerated.id, Role.USER, "")  # empty texts survive too
    tree.switch_variant(u1.id, 1)
    return tree


def _round_trip(records: list[ConversationRecord]) -> list[ConversationRecord]:
    return parse_chatgpt(export_chatgpt(records))


def test_export_then_import_keeps_every_branch_and_the_active_path() -> None:
    tree = _branched_tree()
    record = from_tree(tree, title="Branches")
    (again,) = _round_trip([record])
    validate(again)
    assert _shape(again) == _shape(record)
    assert len(again.nodes) == len(tree)
    assert _active_texts(again) == [n.text for n in tree.active_path()]
    assert _active_texts(again)[-1] == "r2 for the edit"


@pytest.mark.parametrize(
    "make",
    [
        lambda: Tree(),  # only the root, active
        lambda: Tree("system only"),
        lambda: _rewound(Tree()),
        lambda: _rewound(Tree("with a prompt")),
    ],
    ids=["empty", "system-only", "rewound", "rewound-with-prompt"],
)
def test_round_trip_of_small_and_rewound_trees(make: Callable[[], Tree]) -> None:
    record = from_tree(make(), title="Small")
    (again,) = _round_trip([record])
    assert _shape(again) == _shape(record)
    assert _active_texts(again) == _active_texts(record)


def _rewound(tree: Tree) -> Tree:
    """The active leaf is an inner node: its descendants are kept but not active."""
    u0 = tree.add_child(tree.root_id, Role.USER, "hi")
    a0 = tree.add_child(u0.id, Role.ASSISTANT, "hello")
    tree.add_child(a0.id, Role.USER, "later")
    tree.rewind(u0.id)
    return tree


def test_several_conversations_round_trip_in_order_and_export_is_deterministic() -> None:
    records = [
        from_tree(_branched_tree(), title="One"),
        from_tree(Tree("p"), title="Two"),
        *parse_chatgpt(SAMPLE),
    ]
    exported = export_chatgpt(records)
    assert exported == export_chatgpt(records)
    again = parse_chatgpt(exported)
    assert [_shape(r) for r in again] == [_shape(r) for r in records]
    assert [(r.created, r.updated) for r in again] == [(r.created, r.updated) for r in records]


def test_siblings_created_at_the_same_time_keep_their_order() -> None:
    tree = _branched_tree()
    for node in tree.nodes():
        node.created = 0.0  # e.g. imported from a format without times
    record = from_tree(tree, title="Ties")
    (again,) = _round_trip([record])
    assert _shape(again) == _shape(record)


def test_export_writes_the_chatgpt_layout() -> None:
    record = from_tree(_branched_tree(), title="Layout")
    (conversation,) = json.loads(export_chatgpt([record]))
    mapping = conversation["mapping"]
    (top,) = [node for node in mapping.values() if node["parent"] is None]
    assert top["message"] is None
    (system,) = [mapping[child] for child in top["children"]]
    assert system["message"]["author"]["role"] == "system"
    assert system["message"]["content"]["parts"] == ["Be kind.\nAnswer in one line."]
    assert mapping[conversation["current_node"]]["message"]["content"]["parts"] == [
        "r2 for the edit"
    ]
    for node_id, node in mapping.items():
        assert node["id"] == node_id
        times = [mapping[child]["message"]["create_time"] for child in node["children"]]
        assert times == sorted(times)  # children in sibling order
        for child in node["children"]:
            assert mapping[child]["parent"] == node_id


# --- rejections ------------------------------------------------------------------------------


def _with(change: Callable[[dict[str, Any]], None]) -> bytes:
    """The chain conversation after `change`, as a one-conversation export."""
    conversation = _chain_conversation()
    change(conversation)
    return _dump([conversation])


def _set_node(node_id: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(conversation: dict[str, Any]) -> None:
        conversation["mapping"][node_id][key] = value

    return change


def _set_message(node_id: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(conversation: dict[str, Any]) -> None:
        conversation["mapping"][node_id]["message"][key] = value

    return change


def _cycle(conversation: dict[str, Any]) -> None:
    """n2 and n3 become each other's parent and child: consistent links, no path to the root."""
    mapping = conversation["mapping"]
    mapping["n1"]["children"] = []
    mapping["n2"].update(parent="n3", children=["n3"])
    mapping["n3"].update(parent="n2", children=["n2"])


def _second_root(conversation: dict[str, Any]) -> None:
    conversation["mapping"]["x"] = _node("x", None, None, [])


def _listed_twice(conversation: dict[str, Any]) -> None:
    conversation["mapping"]["n1"]["children"] = ["n2", "n2"]


def _unlisted(conversation: dict[str, Any]) -> None:
    conversation["mapping"]["n1"]["children"] = []


REJECTED: list[tuple[str, bytes, str]] = [
    ("nan", b'[{"title": NaN}]', "contains NaN"),
    ("infinity", b"[Infinity]", "contains Infinity"),
    ("minus-infinity", b"[-Infinity]", "contains -Infinity"),
    ("float-overflow", b"[1e999]", "1e999 is too large"),
    ("duplicate-key", b'[{"title": "a", "title": "b"}]', "key 'title' twice"),
    ("deep-nesting", b"[" * 10_000 + b"]" * 10_000, "deeper than 64 levels"),
    ("lone-surrogate", b'[{"title": "\\ud800"}]', r"lone surrogate \(\\ud800\)"),
    ("lone-surrogate-key", b'[{"\\udc00x": 1}]', r"lone surrogate \(\\udc00\)"),
    ("huge-integer", b'[{"create_time": ' + b"9" * 5000 + b"}]", "more than 30 digits"),
    ("integer-31-digits", b"[" + b"1" * 31 + b"]", "more than 30 digits"),
    ("invalid-utf8", b'[{"title": "caf\xe9"}]', "not valid UTF-8"),
    ("truncated", SAMPLE[: len(SAMPLE) // 2], "not valid JSON"),
    ("empty", b"", "not valid JSON"),
    ("top-level-object", b'{"title": "x"}', "JSON array of conversations, but .* an object"),
    ("top-level-string", b'"x"', "JSON array of conversations, but .* a string"),
    ("conversation-not-object", b"[[]]", "conversation 1 must be an object, but is an array"),
    ("cycle", _with(_cycle), "messages form a cycle"),
    ("child-parent-disagree", _with(_set_node("n2", "parent", "n0")), "its parent is 'n0'"),
    ("parent-does-not-list", _with(_unlisted), "which does not list it as a child"),
    ("child-listed-twice", _with(_listed_twice), "lists the child 'n2' twice"),
    ("child-missing", _with(_set_node("n3", "children", ["gone"])), "'gone' that is not in"),
    ("parent-missing", _with(_set_node("n0", "parent", "gone")), "'gone' that is not in"),
    ("two-roots", _with(_second_root), "has 2 roots"),
    ("no-current-node", _with(lambda c: c.pop("current_node")), "current_node .* missing"),
    ("null-current-node", _with(lambda c: c.update(current_node=None)), "current_node .* null"),
    ("unknown-current-node", _with(lambda c: c.update(current_node="x")), "'x' is not in"),
    ("title-number", _with(lambda c: c.update(title=5)), "title must be a string, but is a num"),
    ("mapping-array", _with(lambda c: c.update(mapping=[])), "mapping must be an object, but"),
    ("mapping-missing", _with(lambda c: c.pop("mapping")), "mapping must be an object, but is m"),
    ("mapping-empty", _with(lambda c: c.update(mapping={})), "has no messages"),
    ("node-not-object", _with(lambda c: c["mapping"].update(n3=7)), "'n3' must be an object"),
    ("id-number", _with(_set_node("n1", "id", 1)), "'n1': id must be a string"),
    ("id-differs", _with(_set_node("n1", "id", "n2")), "has the id 'n2'"),
    ("children-string", _with(_set_node("n1", "children", "n2")), "children must be an array"),
    ("child-id-number", _with(_set_node("n1", "children", [2])), "a child id must be a string"),
    ("parent-number", _with(_set_node("n1", "parent", 0)), "parent must be a string"),
    ("message-array", _with(_set_node("n1", "message", [])), "message must be an object"),
    ("role-number", _with(_set_message("n1", "author", {"role": 1})), "author.role must be a s"),
    ("author-missing", _with(lambda c: c["mapping"]["n1"]["message"].pop("author")), "author"),
    (
        "parts-string",
        _with(_set_message("n1", "content", {"content_type": "text", "parts": "hi"})),
        r"content\.parts must be an array",
    ),
    ("content-type-missing", _with(_set_message("n1", "content", {})), "content_type must be"),
    ("metadata-array", _with(_set_message("n1", "metadata", [])), "metadata must be an object"),
    ("time-string", _with(lambda c: c.update(create_time="now")), "number or null, but is a st"),
    ("time-boolean", _with(_set_message("n2", "create_time", True)), "but is a boolean"),
    ("time-negative", _with(lambda c: c.update(update_time=-1)), "not a time between 1970"),
    ("time-year-5000", _with(_set_message("n1", "create_time", 9.5e10)), "between 1970 and 3000"),
]


@pytest.mark.parametrize(("data", "match"), [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED])
def test_malformed_files_are_rejected_with_a_specific_message(data: bytes, match: str) -> None:
    with pytest.raises(FormatError, match=match) as caught:
        parse_chatgpt(data)
    assert isinstance(caught.value, ArborError)
    assert "\n" not in str(caught.value)


def test_size_limit() -> None:
    with pytest.raises(FormatError, match="larger than the limit of 100 bytes"):
        parse_chatgpt(SAMPLE, max_bytes=100)
    assert parse_chatgpt(SAMPLE, max_bytes=len(SAMPLE))


def test_conversation_count_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chatgpt_import, "MAX_CONVERSATIONS", 2)
    with pytest.raises(FormatError, match="holds more than 2 conversations; the limit is 2"):
        parse_chatgpt(_dump([_chain_conversation()] * 3))
    assert len(parse_chatgpt(_dump([_chain_conversation()] * 2))) == 2


def test_the_conversation_limit_bites_while_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file far past the limit is refused before it is parsed whole (a 12 MB file of
    conversations took 363 MiB). Bound: the file's decoded text plus the conversations up to
    the limit, here well under twice the file's size."""
    monkeypatch.setattr(chatgpt_import, "MAX_CONVERSATIONS", 100)
    one = _dump([_chain_conversation(1)])[1:-1]
    data = b"[" + b",".join([one] * (12_000_000 // len(one))) + b"]"
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="the limit is 100"):
            parse_chatgpt(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(data)


def test_a_message_with_a_role_arbor_does_not_know_is_kept_visibly() -> None:
    """A role such as "critic" was dropped and its children re-parented: the message
    vanished. It is kept as a user message that names its role; no message vanishes."""
    conversation = _chain_conversation(3)
    conversation["mapping"]["n2"]["message"]["author"]["role"] = "critic"
    (record,) = parse_chatgpt(_dump([conversation]))
    texts = [node.text for node in record.nodes]
    assert all(any(f"message {i}" in text for text in texts) for i in (1, 2, 3))
    (kept,) = [node for node in record.nodes if "message 2" in node.text]
    assert kept.role is Role.USER and "critic" in kept.text
    assert [n.parent for n in record.nodes][1:] == [n.id for n in record.nodes][:-1]


def test_record_errors_from_validate_become_format_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.core.records, "MAX_DEPTH", 3)
    with pytest.raises(FormatError, match="deeper than 3 messages"):
        parse_chatgpt(_dump([_chain_conversation(5)]))
    monkeypatch.setattr(engine.core.records, "MAX_TEXT", 5)
    with pytest.raises(FormatError, match="longer than 5 characters"):
        parse_chatgpt(_dump([_chain_conversation(1)]))


def test_depth_scan_ignores_brackets_in_strings_and_stays_linear() -> None:
    assert loads_strict('["' + "[" * 1000 + '"]', max_bytes=10_000) == ["[" * 1000]
    assert loads_strict("[" * 64 + "]" * 64, max_bytes=1000) == _nested(63)
    # Escaped quotes and a trailing backslash must not make the scan backtrack: each of these
    # took minutes with a naive string pattern.
    for hostile in ('"\\"' * 300_000, '"' + '\\"' * 300_000 + "\\", '["' + "\\\\" * 300_000):
        start = time.monotonic()
        with pytest.raises(FormatError, match="not valid JSON"):
            loads_strict(hostile, max_bytes=1 << 22)
        assert time.monotonic() - start < 5.0


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_strict_json_basics() -> None:
    assert loads_strict(b'{"a": [1, 2.5, "\xc3\xa9", null, true]}', max_bytes=100) == {
        "a": [1, 2.5, "é", None, True]
    }
    assert dumps_strict({"a": ["é", 1.5]}) == '{"a":["é",1.5]}'.encode()
    assert loads_strict(b"[" + b"9" * 30 + b"]", max_bytes=100) == [int("9" * 30)]
    with pytest.raises(FormatError, match="lone surrogate"):
        dumps_strict(["\ud800"])
    with pytest.raises(FormatError, match="cannot write"):
        dumps_strict([float("nan")])
    with pytest.raises(FormatError, match="deeper than 2"):
        loads_strict("[[[]]]", max_bytes=100, max_depth=2)


# --- Markdown and OpenAI messages ------------------------------------------------------------


def test_markdown_writes_the_active_branch_and_counts_the_others() -> None:
    record = from_tree(_branched_tree(), title="A  title\nwith a break")
    assert export_markdown(record) == (
        "# A title with a break\n\n"
        "> Be kind.\n> Answer in one line.\n\n"
        "## User\n\nq1\n\n"
        "## Assistant\n\nr1\n\n"
        "## User\n\nq2 edited\n\n"
        "## Assistant\n\nr2 for the edit\n\n"
        "_This conversation has 2 other branches; export it as a session file to keep them._\n"
    )


def test_markdown_of_a_linear_conversation_has_no_branch_note() -> None:
    tree = Tree()
    tree.add_child(tree.root_id, Role.USER, "Line one\n\n- a list")
    markdown = export_markdown(from_tree(tree, title=""))
    assert markdown == "# Untitled\n\n## User\n\nLine one\n\n- a list\n"


def test_markdown_counts_a_rewound_branch() -> None:
    markdown = export_markdown(from_tree(_rewound(Tree()), title="R"))
    assert markdown.endswith("has 1 other branch; export it as a session file to keep it._\n")


def test_openai_messages_export_and_import_the_active_branch() -> None:
    record = from_tree(_branched_tree(), title="OpenAI")
    data = export_openai_messages(record)
    assert json.loads(data) == {
        "messages": [
            {"role": "system", "content": "Be kind.\nAnswer in one line."},
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "r1"},
            {"role": "user", "content": "q2 edited"},
            {"role": "assistant", "content": "r2 for the edit"},
        ]
    }
    again = parse_openai_messages(data, title="Back")
    validate(again)
    assert again.title == "Back"
    assert _active_texts(again) == _active_texts(record)
    assert len(again.nodes) == 5 and again.active_leaf == again.nodes[-1].id


def test_openai_messages_without_system_prompt() -> None:
    tree = Tree()
    tree.add_child(tree.root_id, Role.USER, "hi")
    data = export_openai_messages(from_tree(tree, title="x"))
    assert data == b'{"messages":[{"role":"user","content":"hi"}]}'
    assert parse_openai_messages(data).root.text == ""
    empty = parse_openai_messages(b'{"messages": []}')
    assert len(empty.nodes) == 1 and empty.active_leaf == empty.root.id


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'[{"role": "user", "content": "x"}]', '"messages" array'),
        (b'{"messages": {}}', '"messages" array'),
        (b'{"messages": [1]}', "message 1 must be an object"),
        (b'{"messages": [{"role": "robot", "content": "x"}]}', "role 'robot'"),
        (b'{"messages": [{"role": "tool", "content": "x"}]}', "tool_call_id"),
        (b'{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]}]}',
         "without an id, a name"),
        (b'{"messages": [], "tools": [{"type": "function"}]}', "function tools"),
        (b'{"messages": [{"role": 3, "content": "x"}]}', "string role"),
        (b'{"messages": [{"role": "user", "content": null}]}', "string content"),
        (b'{"messages": [{"role": "user", "content": [{"type": "text"}]}]}', "string content"),
        (
            b'{"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}',
            "only as the first message",
        ),
        (b'{"messages": [], "messages": []}', "twice"),
        (b'{"messages": [NaN]}', "NaN"),
    ],
)
def test_openai_messages_rejections(data: bytes, match: str) -> None:
    with pytest.raises(FormatError, match=match):
        parse_openai_messages(data)


def _tool_tree() -> Tree:
    tree = Tree("Weather help.")
    tree.root.meta[TOOLS] = [{"type": "function", "function": {"name": "get_weather"}}]
    user = tree.add_child(tree.root_id, Role.USER, "Rain in Oslo?")
    call = tree.add_child(user.id, Role.ASSISTANT, "")
    call.meta[TOOL_CALLS] = [ToolCall("call_1", "get_weather", '{"city": "Oslo"}').to_meta()]
    result = tree.add_child(call.id, Role.TOOL, '{"rain": true}')
    result.meta[TOOL_CALL_ID] = "call_1"
    tree.add_child(result.id, Role.ASSISTANT, "Yes, 4 mm.")
    return tree


def test_tool_calls_and_results_survive_openai_messages_and_show_in_markdown() -> None:
    record = from_tree(_tool_tree(), title="Rain")
    data = export_openai_messages(record)
    again = parse_openai_messages(data)
    assert export_openai_messages(again) == data
    messages = json.loads(data)["messages"]
    assert messages[2]["tool_calls"][0]["function"] == {"name": "get_weather",
                                                        "arguments": '{"city": "Oslo"}'}
    assert messages[3] == {"role": "tool", "content": '{"rain": true}', "tool_call_id": "call_1"}
    tree = to_tree(again)
    assert tree.root.meta[TOOLS][0]["function"]["name"] == "get_weather"
    assert [n.role for n in tree.messages()] == [Role.USER, Role.ASSISTANT, Role.TOOL,
                                                 Role.ASSISTANT]
    assert export_markdown(record) == (
        "# Rain\n\n> Weather help.\n\n## User\n\nRain in Oslo?\n\n"
        '## Assistant\n\n`get_weather({"city": "Oslo"})`\n\n'
        '## Tool result\n\n{"rain": true}\n\n## Assistant\n\nYes, 4 mm.\n')


# --- fuzzing ---------------------------------------------------------------------------------

def _plugin_conversation() -> dict[str, Any]:
    """A plugin call after the reply's text, two results of it on two branches, an answer."""
    call = {"content_type": "code", "language": "unknown", "text": '{"city": "Oslo"}'}
    mapping = [
        _node("r", None, None, ["u"]),
        _node("u", _message("u", "user", ["Rain?"], t=1.0), "r", ["say"]),
        _node("say", _message("say", "assistant", ["Checking."], t=2.0), "u", ["c"]),
        _node("c", _message("c", "assistant", t=3.0, content=call, recipient="w.get"), "say",
              ["t1", "t2"]),
        _node("t1", _message("t1", "tool", ["dry"], t=4.0), "c", ["a1"]),
        _node("t2", _message("t2", "tool", ["wet"], t=5.0), "c", []),
        _node("a1", _message("a1", "assistant", ["Dry."], t=6.0), "t1", []),
    ]
    for node in mapping[4:6]:
        node["message"]["author"]["name"] = "w.get"
    return {"title": "Plugin", "mapping": {node["id"]: node for node in mapping},
            "current_node": "a1", "arbor_tools": [{"type": "function",
                                                   "function": {"name": "w.get"}}]}


BASES = [SAMPLE, export_chatgpt(parse_chatgpt(SAMPLE)), _dump([_chain_conversation(4)]),
         _dump([_plugin_conversation()]), export_chatgpt([from_tree(_tool_tree(), title="T")])]
INTERESTING_BYTES = b'{}[]",:\\0123456789eE-+.ntfu \xff\xc3\x80'
Mutator = Callable[[bytes, st.DataObject], bytes]


def _truncate(blob: bytes, data: st.DataObject) -> bytes:
    return blob[: data.draw(st.integers(0, len(blob)))]


def _flip_bits(blob: bytes, data: st.DataObject) -> bytes:
    out = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 8))):
        if out:
            out[data.draw(st.integers(0, len(out) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    return bytes(out)


def _replace_bytes(blob: bytes, data: st.DataObject) -> bytes:
    out = bytearray(blob)
    any_byte = st.integers(0, 255) | st.sampled_from(list(INTERESTING_BYTES))
    for _ in range(data.draw(st.integers(1, 4))):
        if out:
            out[data.draw(st.integers(0, len(out) - 1))] = data.draw(any_byte)
    return bytes(out)


def _insert_nesting(blob: bytes, data: st.DataObject) -> bytes:
    depth = data.draw(st.sampled_from([2, 63, 64, 65, 1000, 10_000]))
    nesting = b"[" * depth + (b"]" * depth if data.draw(st.booleans()) else b"")
    at = data.draw(st.integers(0, len(blob)))
    return blob[:at] + nesting + blob[at:]


def _huge_number(blob: bytes, data: st.DataObject) -> bytes:
    numbers = list(re.finditer(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", blob))
    if not numbers:
        return blob
    match = data.draw(st.sampled_from(numbers))
    digits = data.draw(st.sampled_from([20, 30, 31, 300, 5000]))
    big = data.draw(st.sampled_from([b"9" * digits, b"1e999", b"-1e999", b"1" + b"0" * digits]))
    return blob[: match.start()] + big + blob[match.end() :]


def _duplicate_key(blob: bytes, data: st.DataObject) -> bytes:
    keys = list(re.finditer(rb'"([A-Za-z_]+)":', blob))
    if not keys:
        return blob
    match = data.draw(st.sampled_from(keys))
    return blob[: match.start()] + match.group(0) + b"null," + blob[match.start() :]


def _object_mutator(change: Callable[[Any, st.DataObject], None]) -> Mutator:
    """A mutation of the decoded file, written back as JSON (skipped if it does not decode)."""

    def mutate(blob: bytes, data: st.DataObject) -> bytes:
        try:
            value = json.loads(blob)
        except (ValueError, RecursionError):
            return blob
        change(value, data)
        return json.dumps(value).encode("utf-8")

    return mutate


def _mappings(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        return []
    return [
        c["mapping"]
        for c in value
        if isinstance(c, dict) and isinstance(c.get("mapping"), dict) and c["mapping"]
    ]


def _descendants(mapping: dict[str, Any], node_id: str) -> list[str]:
    out: list[str] = []
    stack = [node_id]
    while stack and len(out) < 1000:
        node = mapping.get(stack.pop())
        kids = node.get("children") if isinstance(node, dict) else None
        if isinstance(kids, list):
            found = [k for k in kids if isinstance(k, str) and k in mapping and k not in out]
            out.extend(found)
            stack.extend(found)
    return out


def _parent_to_descendant(value: Any, data: st.DataObject) -> None:
    mappings = _mappings(value)
    if not mappings:
        return
    mapping = data.draw(st.sampled_from(mappings))
    node_id = data.draw(st.sampled_from(sorted(mapping)))
    node = mapping[node_id]
    if not isinstance(node, dict):
        return
    target = data.draw(st.sampled_from([node_id, *_descendants(mapping, node_id)]))
    old_parent = mapping.get(node.get("parent")) if isinstance(node.get("parent"), str) else None
    node["parent"] = target
    if data.draw(st.booleans()):  # keep the children lists in agreement: a pure cycle
        if isinstance(old_parent, dict) and isinstance(old_parent.get("children"), list):
            old_parent["children"] = [c for c in old_parent["children"] if c != node_id]
        if isinstance(mapping[target], dict) and isinstance(mapping[target].get("children"), list):
            mapping[target]["children"].append(node_id)


def _duplicate_id(value: Any, data: st.DataObject) -> None:
    mappings = _mappings(value)
    if not mappings:
        return
    mapping = data.draw(st.sampled_from(mappings))
    ids = sorted(mapping)
    first, second = data.draw(st.sampled_from(ids)), data.draw(st.sampled_from(ids))
    node, other = mapping[first], mapping[second]
    if not isinstance(node, dict) or not isinstance(other, dict):
        return
    how = data.draw(st.integers(0, 2))
    if how == 0:
        node["id"] = second
    elif how == 1 and isinstance(node.get("children"), list):
        node["children"].append(second)
    elif isinstance(node.get("message"), dict):
        node["message"]["id"] = second
        other["children"] = node.get("children")


def _slots(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in the value, containers first."""
    out: list[tuple[Any, Any]] = []
    stack = [value]
    while stack:
        current = stack.pop()
        keys: list[Any] = []
        if isinstance(current, dict):
            keys = list(current)
        elif isinstance(current, list):
            keys = list(range(len(current)))
        for key in keys:
            out.append((current, key))
            stack.append(current[key])
    return out


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["n0", "n1", "u1", "a1", "client-created-root", "\ud800", "system", "tool"]),
    st.sampled_from([[], {}, ["n1"], [{"x": 1}], {"role": "user"}, {"content_type": "text"}]),
)


def _replace_value(value: Any, data: st.DataObject) -> None:
    slots = _slots(value)
    if slots:
        container, key = data.draw(st.sampled_from(slots))
        container[key] = data.draw(JSON_VALUES)


def _delete_key(value: Any, data: st.DataObject) -> None:
    slots = [(c, k) for c, k in _slots(value) if isinstance(c, dict)]
    if slots:
        container, key = data.draw(st.sampled_from(slots))
        del container[key]


def _huge_string(value: Any, data: st.DataObject) -> None:
    slots = [(c, k) for c, k in _slots(value) if isinstance(c[k], str)]
    if slots:
        container, key = data.draw(st.sampled_from(slots))
        size = data.draw(st.sampled_from([1000, 100_000, (4 << 20) + 1]))
        container[key] = data.draw(st.sampled_from(["x", "[", "\\", '"'])) * size


MUTATORS: dict[str, Mutator] = {
    "truncate": _truncate,
    "flip-bits": _flip_bits,
    "replace-bytes": _replace_bytes,
    "insert-nesting": _insert_nesting,
    "huge-number": _huge_number,
    "duplicate-key": _duplicate_key,
    "parent-to-descendant": _object_mutator(_parent_to_descendant),
    "duplicate-id": _object_mutator(_duplicate_id),
    "replace-value": _object_mutator(_replace_value),
    "delete-key": _object_mutator(_delete_key),
    "huge-string": _object_mutator(_huge_string),
}


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_mutated_exports_give_valid_records_or_a_format_error(data: st.DataObject) -> None:
    blob = data.draw(st.sampled_from(BASES))
    for name in data.draw(st.lists(st.sampled_from(sorted(MUTATORS)), min_size=1, max_size=3)):
        blob = MUTATORS[name](blob, data)
    try:
        records = parse_chatgpt(blob)
    except FormatError as error:
        assert str(error) and "\n" not in str(error)
        return
    for record in records:
        validate(record)
    # Whatever is accepted can be written and read back unchanged.
    again = parse_chatgpt(export_chatgpt(records))
    assert [_shape(r) for r in again] == [_shape(r) for r in records]


def test_markdown_writes_a_messages_documents_folded_above_it() -> None:
    from engine.core.attachments import DOCUMENTS, Document, DocumentKind

    tree = Tree()
    user = tree.add_child(tree.root_id, Role.USER, "What does it say?")
    text = "a ``` fence\n<b>not html</b>"
    user.meta[DOCUMENTS] = [Document("a<b>.md", DocumentKind.MARKDOWN, text, "0" * 64,
                                     len(text)).to_meta()]
    markdown = export_markdown(from_tree(tree, title="Doc"))
    assert markdown == (
        "# Doc\n\n## User\n\n<details>\n<summary>📄 a&lt;b&gt;.md</summary>\n\n"
        "````text\na ``` fence\n<b>not html</b>\n````\n\n</details>\n\nWhat does it say?\n")
