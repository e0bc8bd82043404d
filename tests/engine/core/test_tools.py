"""Tool calls as the families write them: found from the chat template, parsed out of a
reply's text (and only when they are real calls of offered tools), forced by a schema."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.api.stops import CallHoldback
from engine.core.call_formats import FORMATS, HERMES, LLAMA3, MISTRAL, ToolSupport, tool_format
from engine.core.tools import ToolCall, call_schema, shown_text, valid_call
from tests.conftest import TOOLS_TEMPLATE

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
TOOLS = [WEATHER, TIME]


def accept(name: str, arguments: dict[str, Any]) -> bool:
    return valid_call(TOOLS, name, arguments)


def test_the_format_comes_from_the_templates_markers() -> None:
    assert tool_format(TOOLS_TEMPLATE.read_text()) is HERMES
    assert tool_format("{% if tools %}[TOOL_CALLS]{% endif %}") is MISTRAL
    assert tool_format("{% if tools %}<|python_tag|>{% endif %}") is LLAMA3
    with pytest.raises(ToolSupport, match="takes no tools"):
        tool_format("{{ messages[0].content }}")
    with pytest.raises(ToolSupport, match="takes no tools"):
        tool_format(None)  # llama.cpp's built-in templates
    with pytest.raises(ToolSupport, match="does not read"):
        tool_format("{% for tool in tools %}{{ tool }}{% endfor %}")


def test_hermes_calls_are_parsed_out_and_the_rest_is_what_the_reply_said() -> None:
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
            '\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    said, calls = HERMES.parse(text, accept)
    assert said == "Let me look."
    assert calls == [("get_weather", {"city": "Oslo"}), ("get_time", {})]


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "get_weather", "arguments": {"city": 7}}</tool_call>',  # schema
    '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',  # not offered
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"</tool_call>',  # JSON
    '<tool_call>["get_weather"]</tool_call>',  # not {name, arguments}
    'No call here.',
])
def test_what_is_not_a_real_call_of_an_offered_tool_stays_text(text: str) -> None:
    assert HERMES.parse(text, accept) == (text, [])


def test_mistral_and_llama3_calls() -> None:
    said, calls = MISTRAL.parse('[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', accept)
    assert (said, calls) == ("", [("get_time", {})])
    assert LLAMA3.parse('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}',
                        accept) == ("", [("get_weather", {"city": "Rome"})])
    assert LLAMA3.parse('{"name": "get_weather", "parameters": {"city": 1}}', accept)[1] == []


def test_a_forced_call_is_one_of_the_tools_or_the_named_one() -> None:
    named = call_schema(TOOLS, "get_weather")
    assert named["properties"]["name"] == {"const": "get_weather"}
    assert named["properties"]["arguments"] == WEATHER["function"]["parameters"]
    anyone = call_schema(TOOLS, "required")
    assert [o["properties"]["name"]["const"] for o in anyone["anyOf"]] == ["get_weather",
                                                                           "get_time"]
    assert anyone["anyOf"][1]["properties"]["arguments"] == {"type": "object"}


def test_calls_keep_their_arguments_and_compare_without_ids_or_spacing() -> None:
    call = ToolCall.new("get_weather", {"city": "Zürich"})
    assert call.id.startswith("call_") and json.loads(call.arguments) == {"city": "Zürich"}
    assert ToolCall.from_meta(call.to_meta()) == call
    assert call.to_template()["function"]["arguments"] == {"city": "Zürich"}  # as templates
    assert call.same_call(ToolCall("other", "get_weather", '{ "city" : "Zürich" }'))
    assert not call.same_call(ToolCall(call.id, "get_weather", '{"city": "Bern"}'))
    assert shown_text("", {"tool_calls": [call.to_meta()]}) == \
        f"`get_weather({call.arguments})`"


def test_a_stream_holds_back_what_may_begin_a_call() -> None:
    held = CallHoldback([f.marker for f in FORMATS])
    out = [held.feed(p) for p in ["Let me ", "look.", "<tool", "_call>{", '"name"']]
    assert "".join(out) == "Let me look." and held.calling
    assert held.marker == "<tool_call>" and held.text[held.begun:] == '{'  # the call's text
    json_first = CallHoldback([f.marker for f in FORMATS])
    assert json_first.feed("  ") == "" and json_first.feed('{"name"') == ""
    assert json_first.calling and json_first.marker is None
    assert json_first.text[json_first.begun:] == '{"name"'
    plain = CallHoldback([f.marker for f in FORMATS])
    shown = "".join(plain.feed(p) for p in ["Sunny ", "all ", "week, I think so."])
    assert not plain.calling and "Sunny all week" in shown
