"""Tool calls and results in ChatGPT's `conversations.json`, both ways.

The ChatGPT conversations below copy the shapes of real exports (2023-2025): a call is an
assistant message addressed to the tool (`recipient`), its arguments JSON code or a text part;
a result is a message of `author.role == "tool"` named after the tool; the code interpreter,
the old browser and web.run leave messages Arbor cannot take as calls or results.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.core.records import ConversationRecord, NodeRecord, from_tree, to_tree, validate
from engine.core.tools import TOOL_CALL_ID, TOOL_CALLS, TOOLS, ToolCall, calls_of
from engine.core.tree import NodeStatus, Role, Tree
from engine.files.regular import FormatError
from engine.storage.formats.chatgpt_export import export_chatgpt
from engine.storage.formats.chatgpt_import import parse_chatgpt
from engine.storage.formats.chatgpt_mapping import ARBOR_CALL_ID
from engine.storage.store import Store
from engine.storage.transfer import FileFormat, export_file, import_file

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
                                          "properties": {"city": {"type": "string"}}}}}]

# --- ChatGPT's messages, as real exports hold them --------------------------------------------


def _msg(
    role: str,
    content: dict[str, Any] | None = None,
    *,
    text: str | None = None,
    name: str | None = None,
    recipient: str = "all",
    t: float = 1_700_000_000.0,
    metadata: dict[str, Any] | None = None,
    channel: str | None = None,
) -> dict[str, Any]:
    return {
        "author": {"role": role, "name": name, "metadata": {}},
        "create_time": t,
        "update_time": None,
        "content": content or {"content_type": "text", "parts": [text or ""]},
        "status": "finished_successfully",
        "end_turn": None if role != "assistant" else recipient == "all",
        "weight": 1.0,
        "metadata": {"model_slug": "gpt-4o", **(metadata or {})},
        "recipient": recipient,
        "channel": channel,
    }


def _code(text: str, language: str = "json") -> dict[str, Any]:
    return {"content_type": "code", "language": language, "response_format_name": None,
            "text": text}


def _conversation(*chain: tuple[str, dict[str, Any] | None, str | None],
                  current: str | None = None) -> dict[str, Any]:
    """(id, message, parent id) triples, parents first: a conversation whose children lists
    agree with the parents; the last message is current unless `current` says otherwise."""
    mapping: dict[str, dict[str, Any]] = {}
    for node_id, message, parent in chain:
        if message is not None:
            message = {"id": node_id, **message}
        mapping[node_id] = {"id": node_id, "message": message, "parent": parent,
                            "children": []}
        if parent is not None:
            mapping[parent]["children"].append(node_id)
    return {"title": "Tools", "create_time": 1_700_000_000.0, "update_time": 1_700_000_100.0,
            "mapping": mapping, "moderation_results": [],
            "current_node": current or chain[-1][0], "plugin_ids": None,
            "conversation_id": "c-1", "id": "c-1"}


def _top() -> list[tuple[str, dict[str, Any] | None, str | None]]:
    """The null root and the hidden system message every real export starts with."""
    hidden = _msg("system", metadata={"is_visually_hidden_from_conversation": True})
    return [("root", None, None), ("sys", hidden, "root")]


def _parse_one(conversation: dict[str, Any]) -> ConversationRecord:
    (record,) = parse_chatgpt(json.dumps([conversation]).encode())
    validate(record)
    return record


def _by_id(record: ConversationRecord) -> dict[str, NodeRecord]:
    return {node.id: node for node in record.nodes}


def _chain(record: ConversationRecord) -> list[tuple[str, str, list[dict[str, str]], str | None]]:
    """The active path below the root: role, text, calls and the call a result answers."""
    return [(node.role.value, node.text, node.meta.get(TOOL_CALLS, []),
             node.meta.get(TOOL_CALL_ID)) for node in to_tree(record).messages()]


def _call(call_id: str, name: str, arguments: str) -> dict[str, str]:
    return ToolCall(call_id, name, arguments).to_meta()


# --- reading ChatGPT's tool traffic ---------------------------------------------------------


def test_a_code_interpreter_exchange_stays_out() -> None:
    """python's "arguments" are Python code and its output has no text part: neither is what
    Arbor's calls and results hold, so both are skipped as before, old style and new."""
    output = {"content_type": "execution_output", "text": "6.0"}
    conversation = _conversation(
        *_top(),
        ("u", _msg("user", text="Mean of 4 and 8?"), "sys"),
        ("c1", _msg("assistant", _code("(4 + 8) / 2", "python"), recipient="python"), "u"),
        ("r1", _msg("tool", output, name="python",
                    metadata={"aggregate_result": {"status": "success"}}), "c1"),
        ("c2", _msg("assistant", text='{"x": 1}', recipient="python", channel="commentary"),
         "r1"),  # gpt-5's: code as a text part; JSON here, but its result has no text part
        ("r2", _msg("tool", output, name="python"), "c2"),
        ("a", _msg("assistant", text="It is 6."), "r2"),
    )
    record = _parse_one(conversation)
    assert _chain(record) == [("user", "Mean of 4 and 8?", [], None),
                              ("assistant", "It is 6.", [], None)]


def test_web_browsing_without_text_results_stays_out() -> None:
    """web.run keeps its results in metadata (empty parts) and the old browser wrote
    `search("...")` commands: no call Arbor can answer, so the replies stay as they were."""
    results = {"search_result_groups": [{"type": "search_result_group", "domain": "x.org",
                                         "entries": []}]}
    browse = {"content_type": "tether_browsing_display", "result": "# 0 Oslo weather",
              "summary": None, "assets": []}
    conversation = _conversation(
        *_top(),
        ("u", _msg("user", text="Weather in Oslo?"), "sys"),
        ("say", _msg("assistant", text="Searching.", channel="commentary"), "u"),
        ("call", _msg("assistant", _code('{"search_query": [{"q": "Oslo weather"}]}',
                                         "unknown"), recipient="web.run"), "say"),
        ("w1", _msg("tool", name="web.run", text=""), "call"),
        ("w2", _msg("tool", name="web.run", text="", metadata=results), "w1"),
        ("old", _msg("assistant", _code('search("Oslo weather")', "unknown"),
                     recipient="browser"), "w2"),
        ("b1", _msg("tool", browse, name="browser"), "old"),
        ("a", _msg("assistant", text="Rainy, 4 °C."), "b1"),
    )
    record = _parse_one(conversation)
    assert _chain(record) == [("user", "Weather in Oslo?", [], None),
                              ("assistant", "Searching.", [], None),
                              ("assistant", "Rainy, 4 °C.", [], None)]


def test_a_canvas_call_becomes_a_reply_made_for_it_and_its_result_a_tool_node() -> None:
    arguments = '{"name": "Plan", "type": "document", "content": "# Plan"}'
    conversation = _conversation(
        *_top(),
        ("u", _msg("user", text="Draft a plan."), "sys"),
        ("thoughts", _msg("assistant", {"content_type": "reasoning_recap",
                                        "content": "Thought for 3s"}), "u"),
        ("call", _msg("assistant", _code(arguments), recipient="canmore.create_textdoc",
                      channel="commentary", t=1_700_000_010.0), "thoughts"),
        ("done", _msg("tool", name="canmore.create_textdoc",
                      text="Successfully created text document 'Plan'"), "call"),
        ("a", _msg("assistant", text="I drafted it."), "done"),
    )
    record = _parse_one(conversation)
    assert _chain(record) == [
        ("user", "Draft a plan.", [], None),
        ("assistant", "", [_call("call", "canmore.create_textdoc", arguments)], None),
        ("tool", "Successfully created text document 'Plan'", [], "call"),
        ("assistant", "I drafted it.", [], None),
    ]
    reply = _by_id(record)["call"]
    assert reply.created == 1_700_000_010.0 and reply.parent == "u"


def test_a_call_after_the_replys_text_joins_that_reply_and_dalle_keeps_its_text() -> None:
    """DALL·E answers with the image (no text: skipped) and then a text message, which is the
    result; the call (a text part, as dalle.text2im's are) joins "Drawing it." above."""
    image = {"content_type": "multimodal_text", "parts": [
        {"content_type": "image_asset_pointer", "asset_pointer": "file-service://file-1",
         "size_bytes": 1, "width": 1024, "height": 1024, "metadata": {}}]}
    prompt = '{"prompt": "An oak in fog", "size": "1024x1024"}'
    conversation = _conversation(
        *_top(),
        ("u", _msg("user", text="Draw an oak."), "sys"),
        ("say", _msg("assistant", text="Drawing it."), "u"),
        ("call", _msg("assistant", text=prompt, recipient="dalle.text2im"), "say"),
        ("img", _msg("tool", image, name="dalle.text2im"), "call"),
        ("note", _msg("tool", name="dalle.text2im", text="DALL·E displayed 1 images."), "img"),
        ("a", _msg("assistant", text="Here it is."), "note"),
    )
    record = _parse_one(conversation)
    assert _chain(record) == [
        ("user", "Draw an oak.", [], None),
        ("assistant", "Drawing it.", [_call("call", "dalle.text2im", prompt)], None),
        ("tool", "DALL·E displayed 1 images.", [], "call"),
        ("assistant", "Here it is.", [], None),
    ]


def test_two_results_of_one_call_on_two_branches() -> None:
    """A regenerated tool message is a second child of the call: two results of the same
    call, each answered on its own branch; current_node picks the second."""
    arguments = '{"city": "Oslo"}'
    conversation = _conversation(
        *_top(),
        ("u", _msg("user", text="Rain in Oslo?"), "sys"),
        ("call", _msg("assistant", _code(arguments, "unknown"),
                      recipient="weather.getForecast"), "u"),
        ("r1", _msg("tool", name="weather.getForecast", text='{"rain": false}', t=1.7e9 + 1),
         "call"),
        ("a1", _msg("assistant", text="No rain."), "r1"),
        ("r2", _msg("tool", name="weather.getForecast", text='{"rain": true}', t=1.7e9 + 2),
         "call"),
        ("a2", _msg("assistant", text="Yes, rain."), "r2"),
        current="a2",
    )
    record = _parse_one(conversation)
    nodes = _by_id(record)
    assert nodes["call"].meta[TOOL_CALLS] == [_call("call", "weather.getForecast", arguments)]
    assert [n.id for n in record.nodes if n.parent == "call"] == ["r1", "r2"]
    assert nodes["r1"].meta == nodes["r2"].meta == {TOOL_CALL_ID: "call"}
    assert record.active_leaf == "a2"
    assert [n.text for n in to_tree(record).messages()] == [
        "Rain in Oslo?", "", '{"rain": true}', "Yes, rain."]


def test_parallel_calls_are_one_reply_and_results_pair_in_order() -> None:
    """Two calls in a row are one reply's; the results below answer them by tool name, the
    first unanswered call of that name first; a system_error answers too."""
    error = {"content_type": "system_error", "name": "tool_error", "text": "Timed out."}
    conversation = _conversation(
        *_top(),
        ("u", _msg("user", text="Oslo and Bergen?"), "sys"),
        ("c1", _msg("assistant", _code('{"city": "Oslo"}'), recipient="w.get"), "u"),
        ("c2", _msg("assistant", _code('{"city": "Bergen"}'), recipient="w.get"), "c1"),
        ("r1", _msg("tool", name="w.get", text="Oslo: rain"), "c2"),
        ("r2", _msg("tool", error, name="w.get"), "r1"),
        ("r3", _msg("tool", name="w.get", text="a third result: no call left"), "r2"),
        ("a", _msg("assistant", text="Rain in Oslo; Bergen timed out."), "r3"),
    )
    record = _parse_one(conversation)
    assert _chain(record) == [
        ("user", "Oslo and Bergen?", [], None),
        ("assistant", "", [_call("c1", "w.get", '{"city": "Oslo"}'),
                           _call("c2", "w.get", '{"city": "Bergen"}')], None),
        ("tool", "Oslo: rain", [], "c1"),
        ("tool", "Timed out.", [], "c2"),
        ("assistant", "Rain in Oslo; Bergen timed out.", [], None),
    ]


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m["r"]["message"]["metadata"].update(is_visually_hidden_from_conversation=True),
        lambda m: m["c"]["message"]["metadata"].update(is_visually_hidden_from_conversation=True),
        lambda m: m["r"]["message"]["author"].update(name="other.tool"),
        lambda m: m["r"]["message"]["content"].update(parts=["  "]),
        lambda m: m["c"]["message"]["content"].update(text="not json"),
        lambda m: m["c"]["message"]["content"].update(text='["an", "array"]'),
        lambda m: m["c"]["message"].update(recipient="all"),
    ],
    ids=["hidden-result", "hidden-call", "other-tool", "blank-result", "not-json", "array",
         "to-the-user"],
)
def test_what_cannot_be_paired_is_skipped_as_before(
    change: Callable[[dict[str, Any]], None],
) -> None:
    conversation = _conversation(
        *_top(),
        ("u", _msg("user", text="Q"), "sys"),
        ("c", _msg("assistant", _code('{"q": 1}'), recipient="t.run"), "u"),
        ("r", _msg("tool", name="t.run", text="result"), "c"),
        ("a", _msg("assistant", text="A"), "r"),
        current="r",
    )
    change(conversation["mapping"])
    record = _parse_one(conversation)
    assert [(n.id, n.parent, n.meta) for n in record.nodes[1:]] == [("u", "root", {}),
                                                                   ("a", "u", {})]
    assert record.active_leaf == "u"  # current_node was the skipped result: it moves up


def test_a_call_below_a_branching_reply_gets_a_reply_of_its_own() -> None:
    """Merging the call into a reply with two children would give the other branch a call it
    never made."""
    conversation = _conversation(
        *_top(),
        ("u", _msg("user", text="Q"), "sys"),
        ("say", _msg("assistant", text="Let me look."), "u"),
        ("c", _msg("assistant", _code('{"q": 1}'), recipient="t.run"), "say"),
        ("r", _msg("tool", name="t.run", text="found"), "c"),
        ("other", _msg("user", text="Never mind."), "say"),
        current="r",
    )
    record = _parse_one(conversation)
    nodes = _by_id(record)
    assert TOOL_CALLS not in nodes["say"].meta
    assert nodes["c"].parent == "say" and nodes["c"].meta[TOOL_CALLS][0]["id"] == "c"
    assert nodes["r"].parent == "c" and nodes["other"].parent == "say"


def test_a_result_without_a_call_above_is_skipped() -> None:
    conversation = _conversation(
        *_top(),
        ("u", _msg("user", text="Q"), "sys"),
        ("a", _msg("assistant", text="A"), "u"),
        ("r", _msg("tool", name="t.run", text="stray"), "a"),
    )
    record = _parse_one(conversation)
    assert [n.role for n in record.nodes] == [Role.SYSTEM, Role.USER, Role.ASSISTANT]


def test_a_call_at_the_top_gets_an_empty_system_root_above_its_reply() -> None:
    conversation = _conversation(
        ("c", _msg("assistant", _code('{"q": 1}'), recipient="t.run"), None),
        ("r", _msg("tool", name="t.run", text="ok"), "c"),
    )
    record = _parse_one(conversation)
    assert record.root.id not in ("c", "r") and record.root.text == ""
    assert [n.role for n in to_tree(record).messages()] == [Role.ASSISTANT, Role.TOOL]


# --- Arbor -> ChatGPT -> Arbor ------------------------------------------------------------------


def _edited_result_tree() -> Tree:
    """A call, two results on two branches (the second an edit of the first), an answer
    after each; then a reply with two calls and no text; the tools offered on the root."""
    tree = Tree("Weather help.")
    tree.root.meta[TOOLS] = WEATHER
    user = tree.add_child(tree.root_id, Role.USER, "Rain in Oslo?")
    reply = tree.add_child(user.id, Role.ASSISTANT, "Let me check.")
    reply.meta[TOOL_CALLS] = [_call("call_1", "get_weather", '{"city": "Oslo"}')]
    first = tree.add_child(reply.id, Role.TOOL, '{"rain": false}')
    first.meta[TOOL_CALL_ID] = "call_1"
    tree.add_child(first.id, Role.ASSISTANT, "No rain.")
    edited = tree.add_sibling(first.id, '{"rain": true, "mm": 4}')
    edited.meta[TOOL_CALL_ID] = "call_1"
    answer = tree.add_child(edited.id, Role.ASSISTANT, "Yes, 4 mm.")
    more = tree.add_child(answer.id, Role.USER, "And Bergen and Tromsø?")
    both = tree.add_child(more.id, Role.ASSISTANT, "", status=NodeStatus.INTERRUPTED)
    both.meta[TOOL_CALLS] = [_call("call_2", "get_weather", '{"city": "Bergen"}'),
                             _call("call_3", "get_weather", '{"city": "Tromsø"}')]
    bergen = tree.add_child(both.id, Role.TOOL, "dry")
    bergen.meta[TOOL_CALL_ID] = "call_2"
    tromso = tree.add_child(bergen.id, Role.TOOL, "snow")
    tromso.meta[TOOL_CALL_ID] = "call_3"
    tree.add_child(tromso.id, Role.ASSISTANT, "Bergen dry, Tromsø snow.")
    tree.switch_variant(first.id, 1)
    return tree


Full = tuple[str, str, str, bool, dict[str, Any], tuple[Any, ...]]


def _full_shape(record: ConversationRecord) -> Full:
    """The whole tree up to ids: role, text, status, on the active path, meta, children."""
    tree = to_tree(record)
    active = {node.id for node in tree.active_path()}

    def build(node_id: int) -> Full:
        node = tree.node(node_id)
        return (node.role.value, node.text, node.status.value, node_id in active,
                dict(node.meta), tuple(build(child) for child in node.children))

    return build(tree.root_id)


def test_round_trip_keeps_calls_results_on_two_branches_and_the_tools() -> None:
    record = from_tree(_edited_result_tree(), title="Rain")
    (again,) = parse_chatgpt(export_chatgpt([record]))
    validate(again)
    assert _full_shape(again) == _full_shape(record)
    assert [n.text for n in to_tree(again).active_path()] == [
        n.text for n in to_tree(record).active_path()]
    assert again.root.meta == {TOOLS: WEATHER}
    assert export_chatgpt([again]) == export_chatgpt([again])  # deterministic


def test_export_writes_chatgpt_shapes() -> None:
    record = from_tree(_edited_result_tree(), title="Rain")
    (conversation,) = json.loads(export_chatgpt([record]))
    assert conversation["arbor_tools"] == WEATHER
    messages = [node["message"] for node in conversation["mapping"].values() if node["message"]]
    (text,) = [m for m in messages if m["content"].get("parts") == ["Let me check."]]
    assert (text["author"]["role"], text["recipient"], text["metadata"]) == ("assistant", "all",
                                                                            {})
    calls = [m for m in messages if m["recipient"] != "all"]
    assert calls[0]["content"] == {
        "content_type": "code", "language": "json", "response_format_name": None,
        "text": '{"city": "Oslo"}'}
    assert [(m["author"]["role"], m["recipient"], m["metadata"], m["end_turn"]) for m in calls] == [
        ("assistant", "get_weather", {ARBOR_CALL_ID: f"call_{i}"}, False) for i in (1, 2, 3)]
    results = [m for m in messages if m["author"]["role"] == "tool"]
    assert [(m["author"]["name"], m["content"]["parts"], m["metadata"], m["recipient"])
            for m in results] == [
        ("get_weather", ['{"rain": false}'], {ARBOR_CALL_ID: "call_1"}, "all"),
        ("get_weather", ['{"rain": true, "mm": 4}'], {ARBOR_CALL_ID: "call_1"}, "all"),
        ("get_weather", ["dry"], {ARBOR_CALL_ID: "call_2"}, "all"),
        ("get_weather", ["snow"], {ARBOR_CALL_ID: "call_3"}, "all"),
    ]
    # The reply without text has no text message: its first call carries its status.
    assert [m["status"] for m in calls] == ["finished_successfully",
                                           "finished_partial_completion",
                                           "finished_successfully"]
    by_id = conversation["mapping"]
    first_call = next(n for n in by_id.values() if n["message"] is calls[0])
    assert by_id[first_call["parent"]]["message"] is text


def test_calls_after_a_reply_they_hang_alone_under_keep_their_own_reply() -> None:
    """A reply with calls and no text under an assistant reply (a continued or second reply)
    gets an empty text message, or it would come back as part of the reply above."""
    tree = Tree()
    user = tree.add_child(tree.root_id, Role.USER, "Q")
    said = tree.add_child(user.id, Role.ASSISTANT, "First part.")
    calls = tree.add_child(said.id, Role.ASSISTANT, "")
    calls.meta[TOOL_CALLS] = [_call("c9", "t", "{}")]
    again = tree.add_child(calls.id, Role.ASSISTANT, "")  # calls again, right below
    again.meta[TOOL_CALLS] = [_call("c10", "t", "{}")]  # unanswered: Arbor's are kept
    record = from_tree(tree, title="Two")
    data = export_chatgpt([record])
    (back,) = parse_chatgpt(data)
    assert _full_shape(back) == _full_shape(record)
    messages = [n["message"] for n in json.loads(data)[0]["mapping"].values() if n["message"]]
    assert [m["content"].get("parts") for m in messages if m["recipient"] == "all"] == [
        ["Q"], ["First part."], [""], [""]]


def test_odd_arbor_trees_survive_too() -> None:
    """A result whose call is nowhere above, one without a call id, arguments that are not
    JSON, a tool named "all", calls held by a user message (not written: only replies call)."""
    tree = Tree()
    user = tree.add_child(tree.root_id, Role.USER, "Q")
    user.meta[TOOL_CALLS] = [_call("u1", "t", "{}")]
    reply = tree.add_child(user.id, Role.ASSISTANT, "")
    reply.meta[TOOL_CALLS] = [_call("c1", "all", "not json"), _call("c2", "t", "")]
    stray = tree.add_child(reply.id, Role.TOOL, "for a call not made")
    stray.meta[TOOL_CALL_ID] = "elsewhere"
    tree.add_child(stray.id, Role.TOOL, "no id at all")
    record = from_tree(tree, title="Odd")
    (back,) = parse_chatgpt(export_chatgpt([record]))
    user.meta.pop(TOOL_CALLS)
    assert _full_shape(back) == _full_shape(from_tree(tree, title="Odd"))
    (replied,) = [n for n in back.nodes if n.role is Role.ASSISTANT]
    assert calls_of(replied.meta) == (ToolCall("c1", "all", "not json"), ToolCall("c2", "t", ""))


def test_an_arbor_file_without_tool_data_reads_as_before() -> None:
    """What an older Arbor wrote for a reply that called a tool: the reply's text alone, and
    the result as a tool message without name or id. Nothing pairs: read as it always was."""
    conversation = _conversation(
        ("top", None, None),
        ("s", _msg("system", text="Weather help."), "top"),
        ("u", _msg("user", text="Rain in Oslo?"), "s"),
        ("c", _msg("assistant", text=""), "u"),
        ("r", _msg("tool", text='{"rain": true}'), "c"),
        ("a", _msg("assistant", text="Yes, 4 mm."), "r"),
    )
    for node in conversation["mapping"].values():
        if node["message"] is not None:
            node["message"]["metadata"] = {}
    record = _parse_one(conversation)
    assert record.root.meta == {} and record.root.text == "Weather help."
    assert [(n.id, n.parent, n.role, n.text, n.meta) for n in record.nodes[1:]] == [
        ("u", "top", Role.USER, "Rain in Oslo?", {}),
        ("c", "u", Role.ASSISTANT, "", {}),
        ("a", "c", Role.ASSISTANT, "Yes, 4 mm.", {}),
    ]


# --- rejections -----------------------------------------------------------------------------


def _tool_conversation() -> dict[str, Any]:
    return _conversation(
        *_top(),
        ("u", _msg("user", text="Q"), "sys"),
        ("c", _msg("assistant", _code('{"q": 1}'), recipient="t.run"), "u"),
        ("r", _msg("tool", name="t.run", text="result"), "c"),
    )


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set a value in the conversation at a dotted path (mapping ids are keys like any)."""
    def change(conversation: dict[str, Any]) -> None:
        *steps, last = path.split(".")
        target = conversation
        for step in steps:
            target = target[step]
        target[last] = value
    return change


def _second_call(conversation: dict[str, Any]) -> None:
    mapping = conversation["mapping"]
    mapping["c"]["message"]["metadata"][ARBOR_CALL_ID] = "same"
    second = _msg("assistant", _code("{}"), recipient="t.run",
                  metadata={ARBOR_CALL_ID: "same"})
    mapping["c2"] = {"id": "c2", "message": {"id": "c2", **second}, "parent": "c",
                     "children": ["r"]}
    mapping["c"]["children"] = ["c2"]
    mapping["r"]["parent"] = "c2"


REJECTED: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("tools-object", _set("arbor_tools", {}), "arbor_tools must be an array"),
    ("tools-no-name", _set("arbor_tools", [{"type": "function", "function": {}}]),
     "function tools, each with a name"),
    ("tools-not-objects", _set("arbor_tools", ["get_weather"]), "function tools"),
    ("call-id-number", _set(f"mapping.c.message.metadata.{ARBOR_CALL_ID}", 7),
     f"metadata.{ARBOR_CALL_ID} must be a string"),
    ("result-id-object", _set(f"mapping.r.message.metadata.{ARBOR_CALL_ID}", {}),
     f"metadata.{ARBOR_CALL_ID} must be a string"),
    ("code-text-missing", _set("mapping.c.message.content", {"content_type": "code"}),
     r"content\.text must be a string, but is missing"),
    ("code-language-number", _set("mapping.c.message.content.language", 3),
     r"content\.language must be a string"),
    ("tool-name-number", _set("mapping.r.message.author.name", 1),
     r"author\.name must be a string"),
    ("error-text-null", _set("mapping.r.message.content",
                             {"content_type": "system_error", "text": None}),
     r"content\.text must be a string, but is null"),
    ("two-calls-one-id", _second_call, "makes two tool calls with the id 'same'"),
]


@pytest.mark.parametrize(("change", "match"), [c[1:] for c in REJECTED],
                         ids=[c[0] for c in REJECTED])
def test_bad_tool_data_is_a_format_error(
    change: Callable[[dict[str, Any]], None], match: str
) -> None:
    conversation = _tool_conversation()
    change(conversation)
    good = json.dumps([_tool_conversation()]).encode()
    with pytest.raises(FormatError, match=match) as caught:
        parse_chatgpt(good[:-1] + b"," + json.dumps(conversation).encode() + b"]")
    assert "\n" not in str(caught.value) and "conversation 2" in str(caught.value)


def test_round_trip_through_the_store_and_the_file(tmp_path: Path) -> None:
    """File > Export and File > Import: the store's record out, the file's records in."""
    with Store(tmp_path / "a.db") as store:
        cid = store.create(_edited_result_tree(), title="Rain")
        path = tmp_path / "conversations.json"
        export_file(store, [cid], path, FileFormat.CHATGPT)
        (new_id,) = import_file(path, store).conversation_ids
        assert _full_shape(store.record(new_id)) == _full_shape(store.record(cid))
