"""What the chat shows of a tool's result and a call's arguments: JSON laid out for reading
(only whitespace moves), anything else as it came."""

from __future__ import annotations

import json

import pytest

from app.chat.tool_text import WIDTH, arguments_text, pretty_json, result_text, spoken_call
from engine.core.tools import ToolCall


def test_a_short_object_stays_on_one_line() -> None:
    assert result_text('{"sky":"rain",  "temp_c":9}') == '{"sky": "rain", "temp_c": 9}'
    assert result_text("[]") == "[]" and result_text('{"a": {}}') == '{"a": {}}'


def test_a_long_object_puts_a_member_on_a_line_and_short_ones_stay_whole() -> None:
    text = json.dumps({"items": [{"id": 1, "title": "A fairly long title that goes on and on",
                                  "tags": ["x", "y"]}, {"id": 2, "tags": []}], "next": None})
    assert result_text(text).split("\n") == [
        "{",
        '  "items": [',
        "    {",
        '      "id": 1,',
        '      "title": "A fairly long title that goes on and on",',
        '      "tags": ["x", "y"]',
        "    },",
        '    {"id": 2, "tags": []}',
        "  ],",
        '  "next": null',
        "}",
    ]
    assert all(len(line) <= WIDTH for line in result_text(text).split("\n"))


def test_only_whitespace_moves() -> None:
    """Numbers, escapes and duplicate keys stay as written: nothing is parsed into values
    and written back."""
    text = ('{"a": 1.50, "a": 1e400, "b": "\\u00e9 \\"quoted\\" \\n", "c": 12345678901234567890,'
            ' "d": [true, false, null], "e": "a long string to make the object break into lines"}')
    pretty = pretty_json(text)
    assert pretty is not None and "\n" in pretty
    assert "".join(pretty.split()) == "".join(text.split())
    for token in ('"a": 1.50', '"a": 1e400', '"\\u00e9 \\"quoted\\" \\n"', "12345678901234567890"):
        assert token in pretty


@pytest.mark.parametrize("text", [
    "plain words\n  and an indented line",
    '{"a": 1} and then words',
    '"just a string"',
    "42",
    "{not json}",
    "",
    '{"a": 1}\n{"b": 2}',  # JSON lines: two documents, shown as they came
])
def test_anything_else_is_shown_as_it_came(text: str) -> None:
    assert pretty_json(text) is None
    assert result_text(text) == text


def test_a_calls_arguments() -> None:
    assert arguments_text("") == "{}"
    assert arguments_text('{"city":"Oslo"}') == '{"city": "Oslo"}'
    assert arguments_text("not json") == "not json"


def test_a_call_in_words() -> None:
    call = ToolCall("c", "get_weather", '{"city": "Oslo", "days": 3, "hourly": true}')
    assert spoken_call(call) == "get_weather with city: Oslo, days: 3, hourly: true"
    assert spoken_call(ToolCall("c", "now", "{}")) == "now"
    assert spoken_call(ToolCall("c", "f", "oops")) == "f with oops"
