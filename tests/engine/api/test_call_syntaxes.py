"""Tool calls in the syntaxes other than `{"name", "arguments"}` objects, streamed as they are
written: Mistral's `name[ARGS]{...}`, Qwen's XML, LFM2's Python-like calls. However the reply's
text comes in pieces, the deltas of a call add up to the arguments of the call the finished
reply makes (the format's own `parse` and `ToolCall.new`, as the engine makes it), and none
is taken back."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from openai import OpenAI

from engine.api.calls import CallStream
from engine.api.calls_xml import may_be_literal
from engine.api.server import Server, ServerOptions
from engine.api.trees import LocalTrees
from engine.api.worker import ApiWorker
from engine.core.call_formats import (
    FORMATS,
    HERMES,
    LFM2,
    MISTRAL,
    MISTRAL_ARGS,
    QWEN_XML,
    Call,
    ToolFormat,
    xml_value,
)
from engine.core.tools import ToolCall, valid_call
from tests.engine.api.test_calls import (
    JSON_VALUES,
    ScriptedEngine,
    _accumulate,
    _calls,
    _pieces,
    _written,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"}, "zip": {"type": "string"}, "days": {"type": "integer"},
        "hourly": {"type": "boolean"}, "notes": {"type": "array"}},
    "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
SYNTAXES = (MISTRAL_ARGS, QWEN_XML, LFM2)
# Values that test the edges: a value's end tag inside it, quotes, escapes, blanks, text that
# begins like JSON, characters outside the BMP and combining ones.
CALLS: list[Call] = [
    ("get_weather", {"city": 'São Paulo <b>\n</b> "q" \\ é 😀 e\u0301 \t', "zip": "0150",
                     "days": 12, "hourly": False, "notes": [1.5, "a\nb", None]}),
    ("get_time", {}),
    ("get_time", {"zone": "2024-05-01 trueish"}),
]


def _made(calling: ToolFormat, text: str, tools: list[dict[str, Any]] | None = TOOLS
          ) -> list[ToolCall]:
    """The calls the engine makes of a reply's text (engine.llm.reply); `tools` None: any."""
    _said, calls = calling.parse(text, lambda name, arguments: tools is None
                                 or valid_call(tools, name, arguments))
    return [ToolCall.new(name, arguments) for name, arguments in calls]


def _streams_as_made(calling: ToolFormat, text: str, pieces: list[str], *,
                     tools: list[dict[str, Any]] | None = TOOLS, said: str = "") -> None:
    made = _made(calling, text, tools)
    assert made
    stream = CallStream([calling], tools=tools or ())
    content, deltas = _accumulate(stream, pieces)
    assert content == said
    assert [(c["name"], c["arguments"]) for c in _calls(deltas)] == \
        [(m.name, m.arguments) for m in made], pieces
    owed, named = stream.finish(made)
    assert owed == [] and [c.id for c in named] == [c["id"] for c in _calls(deltas)]


@pytest.mark.parametrize("calling", SYNTAXES, ids=lambda f: f.name)
def test_calls_stream_whole_in_pieces_of_every_size_and_cut_anywhere(calling: ToolFormat
                                                                     ) -> None:
    text = "Checking.\n" + calling.render(CALLS)
    for size in range(1, len(text) + 1):
        _streams_as_made(calling, text, [text[i:i + size] for i in range(0, len(text), size)],
                         said="Checking.\n")
    for cut in range(len(text) + 1):
        _streams_as_made(calling, text, [text[:cut], text[cut:]], said="Checking.\n")


KEYS = st.from_regex(r"p_[a-z0-9_]{0,5}", fullmatch=True)  # no Python keyword
# Text made of what the readers look at: the end tag, blanks, what begins JSON or True.
TRICKY = st.text(alphabet="\n</parameter>T1-e. \"[{\\é", max_size=16)
ARGUMENTS = st.dictionaries(KEYS, JSON_VALUES | TRICKY, max_size=4)


@settings(max_examples=200, deadline=None)
@given(calling=st.sampled_from(SYNTAXES), first=ARGUMENTS, second=ARGUMENTS,
       style=st.integers(0, 2), cuts=st.lists(st.integers(0, 10**6), max_size=40))
def test_any_arguments_stream_as_the_reply_reads_them(
    calling: ToolFormat, first: dict[str, Any], second: dict[str, Any], style: int,
    cuts: list[int]
) -> None:
    """Whatever the values (text that reads as JSON, blanks, line breaks, end tags, nesting),
    the stream reads them as the finished reply does (XML values untyped: no schema)."""
    text = calling.render([("f", first), ("g", second)])
    if calling is MISTRAL_ARGS:  # spaced, indented, or escaping all but ASCII
        text = "".join(f"[TOOL_CALLS]{name}[ARGS]{_written(arguments, style)}"
                       for name, arguments in [("f", first), ("g", second)])
    made = _made(calling, text, None)
    assume(len(made) == 2)  # an XML value with `</parameter>` in it is no call
    _streams_as_made(calling, text, _pieces(text, cuts), tools=None)


def _python_string(text: str, ways: list[int]) -> str:
    """`text` as a Python literal, each character written one of the ways Python reads
    (itself, `\\x..`, octal, `\\u....`, `\\U........`, `\\N{...}`), in pieces of
    either quote ("a" 'b' is one string)."""
    quote, out = '"', ['"']
    for at, ch in enumerate(text):
        way = ways[at % len(ways)] if ways else 0
        if way >= 10:  # a new piece
            other = "'" if quote == '"' else '"'
            out.append(f"{quote}{' ' * (way % 3)}{other}")
            quote = other
        code, after = ord(ch), text[at + 1:at + 2]
        match way % 6:
            case 0 if ch not in "\\\n\r\0'\"":
                out.append(ch)
            case 1 if code < 0x100:
                out.append(f"\\x{code:02x}")
            case 2 if code < 0o400:  # as few digits as the next character allows
                out.append(f"\\{code:03o}" if after in "01234567" else f"\\{code:o}")
            case 3 if code < 0x10000:
                out.append(f"\\u{code:04X}")
            case 4 if unicodedata.name(ch, ""):
                out.append(f"\\N{{{unicodedata.name(ch)}}}")
            case _:
                out.append(f"\\U{code:08x}")
    return "".join(out) + quote


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=12), ways=st.lists(st.integers(0, 12), max_size=12),
       cuts=st.lists(st.integers(0, 10**6), max_size=30))
def test_python_strings_written_any_way_python_reads_stream_as_read(
    text: str, ways: list[int], cuts: list[int]
) -> None:
    literal = _python_string(text, ways)
    reply = f"<|tool_call_start|>[f(p_a={literal}, p_b=[1, 'x'])]<|tool_call_end|>"
    (made,) = _made(LFM2, reply, None)
    assert made.arguments == json.dumps({"p_a": text, "p_b": [1, "x"]}, ensure_ascii=False)
    _streams_as_made(LFM2, reply, _pieces(reply, cuts), tools=None)


def _sent(stream: CallStream, pieces: list[str]) -> list[str]:
    """The arguments each piece sends."""
    return ["".join(d.arguments for d in stream.feed(piece)[1] if d.id is None)
            for piece in pieces]


def test_xml_text_goes_out_as_it_comes_and_json_values_once_they_end() -> None:
    pieces = ["<tool_call>\n<function=get_weather>\n<parameter=city>\nOs", "lo\n",
              "</param", "eter>\n<parameter=days>\n1", "2\n</parameter>\n<parameter=zip>\n",
              "1000", "1\n</parameter>\n<parameter=hourly>\nTru", "e", "\n</parameter>\n",
              "<parameter=notes>\n[1,", ' "x"]\n</parameter>\n</function>\n</tool_call>']
    assert _sent(CallStream([QWEN_XML], tools=TOOLS), pieces) == \
        ['{"city": "Os', "lo", "", '", "days": ', '12, "zip": ',  # a number once it ends
         "", '"10001", "hourly": ',  # typed as the schema takes it: text
         "", "true", ', "notes": ', '[1, "x"]}']
    text = ["<tool_call>\n<function=get_time>\n<parameter=zone>\nTr", "ondheim 2\n", "4",
            "\n</parameter>\n</function>"]
    assert _sent(CallStream([QWEN_XML]), text) == ['{"zone": ', '"Trondheim 2', "\\n4",
                                                   '"}']  # "Tr" may be True, "2\n" not an end


def test_python_strings_go_out_as_they_come_decoded_as_python_decodes_them() -> None:
    pieces = ['<|tool_call_start|>[get_weather(city="Os', "lo\\", 'u00e9" ', ' "!\\', "1",
              "01 \\N{", 'BLACK STAR}", days=1', "2, hourly=tr", "ue, zip='0\\'1')]"]
    assert _sent(CallStream([LFM2]), pieces) == \
        ['{"city": "Os', "lo", "é", "!", "", "A ", '★", "days": ',  # "a" "b": one string
         '12, "hourly": ', 'true, "zip": "0\'1"}']
    (made,) = _made(LFM2, "".join(pieces) + "<|tool_call_end|>")
    assert made.arguments == '{"city": "Osloé!A ★", "days": 12, "hourly": true, "zip": "0\'1"}'


def test_mistral_names_with_or_without_a_call_id() -> None:
    pieces = ["[TOOL_CALLS]get_", "weather[", "CALL_ID]a1B2c3D4e[AR", 'GS]{"city": "Os',
              'lo", "days": 1', "2}[TOOL_CALLS]get_time[ARGS]{}"]
    stream = CallStream([MISTRAL_ARGS])
    deltas = [stream.feed(piece)[1] for piece in pieces]
    assert [(d.index, d.name, d.arguments) for d in deltas[1]] == [(0, "get_weather", "")]
    assert [d.arguments for d in deltas[3]] == ['{"city": "Os']
    assert [(d.index, d.name, d.arguments) for d in deltas[5]] == \
        [(0, None, "12}"), (1, "get_time", ""), (1, None, "{}")]


@pytest.mark.parametrize("calling", SYNTAXES, ids=lambda f: f.name)
def test_with_parallel_calls_off_only_the_first_streams(calling: ToolFormat) -> None:
    text = calling.render(CALLS)
    stream = CallStream([calling], tools=TOOLS, parallel=False)
    _content, deltas = _accumulate(stream, list(text))
    made = _made(calling, text)[:1]  # the engine keeps the first (engine.llm.reply)
    assert [(c["name"], c["arguments"]) for c in _calls(deltas)] == \
        [(made[0].name, made[0].arguments)]
    assert stream.finish(made)[0] == []


@pytest.mark.parametrize("calling", SYNTAXES, ids=lambda f: f.name)
def test_a_call_cut_short_streams_a_prefix_and_finish_squares_it(calling: ToolFormat) -> None:
    """Cut anywhere (max_tokens, a stop sequence): what was streamed of each call is a
    prefix of its arguments, and `finish` with the calls the cut reply made owes only their
    rest (a call not made stays as it was streamed)."""
    text = calling.render(CALLS)
    whole = _made(calling, text)
    for cut in range(len(text) + 1):
        stream = CallStream([calling], tools=TOOLS)
        _content, deltas = _accumulate(stream, [text[:cut]])
        streamed = _calls(deltas)
        for call, full in zip(streamed, whole, strict=False):
            assert call["name"] == full.name and full.arguments.startswith(call["arguments"])
        made = _made(calling, text[:cut])
        owed, named = stream.finish(made)
        got = {c["id"]: c["arguments"] for c in _calls(deltas + owed)}
        assert all(got[call.id] == call.arguments for call in named), cut


@pytest.mark.parametrize("calling", SYNTAXES, ids=lambda f: f.name)
def test_a_call_that_fails_its_schema_is_not_made_and_is_not_taken_back(calling: ToolFormat
                                                                        ) -> None:
    """As for JSON calls (docs/api.md, "Tools": a call that is not made): the invalid one keeps
    what was streamed of it; the valid one after it is matched to its own index."""
    text = calling.render([("get_weather", {"city": "Oslo", "days": "three"}),
                           ("get_time", {"zone": "UTC"})])
    made = _made(calling, text)
    stream = CallStream([calling], tools=TOOLS)
    _content, deltas = _accumulate(stream, list(text))
    streamed = _calls(deltas)
    if calling is LFM2:  # one list: one bad call and none of it is made
        assert made == [] and stream.finish(made) == ([], ())
        assert [c["name"] for c in streamed] == ["get_weather", "get_time"]
        return
    assert [c.name for c in made] == ["get_time"]
    assert streamed[0]["arguments"] == '{"city": "Oslo", "days": "three"}'
    owed, (named,) = stream.finish(made)
    assert owed == [] and named.id == streamed[1]["id"]


def test_a_value_typed_otherwise_than_the_stream_did_comes_whole_at_the_end() -> None:
    """Without the tools' schemas the stream types `10001` as a number; the finished call,
    whose schema wants text, has "10001": the call comes again, whole, at the next index."""
    text = QWEN_XML.render([("get_weather", {"city": "Oslo", "zip": "10001"})])
    (made,) = _made(QWEN_XML, text)
    assert made.arguments == '{"city": "Oslo", "zip": "10001"}'
    stream = CallStream([QWEN_XML])  # no tools
    _content, deltas = _accumulate(stream, [text])
    assert _calls(deltas)[0]["arguments"] == '{"city": "Oslo", "zip": 10001}'
    owed, (named,) = stream.finish([made])
    assert _calls(deltas + owed)[1] == {"id": named.id, "name": "get_weather",
                                        "arguments": made.arguments}


def test_the_format_is_the_models_or_what_follows_its_marker() -> None:
    """Given the model's format, the stream reads only its calls, and holds back a reply
    that opens with `{` only for Llama 3; given them all, what follows a shared marker
    decides (Hermes' `{` or Qwen's `<function=`, Mistral's `[` or a name)."""
    xml = QWEN_XML.render([("get_time", {"zone": "UTC"})])
    assert _calls(_accumulate(CallStream([HERMES]), [xml])[1]) == []
    assert _accumulate(CallStream([QWEN_XML]), ['{"a": 1}'])[0] == '{"a": 1}'
    for calling, text in [(QWEN_XML, xml), (HERMES, HERMES.render(CALLS[2:])),
                          (MISTRAL, MISTRAL.render(CALLS[2:])),
                          (MISTRAL_ARGS, MISTRAL_ARGS.render(CALLS[2:]))]:
        _content, deltas = _accumulate(CallStream(FORMATS), list(text))
        assert [(c["name"], c["arguments"]) for c in _calls(deltas)] == \
            [(m.name, m.arguments) for m in _made(calling, text)]


def test_what_may_still_read_as_json_is_held() -> None:
    for raw in ["true", "-Infinity", "None", " 12", "1.5e-3", "[1,", '"q', "{"]:
        assert all(may_be_literal(raw[:n]) for n in range(1, len(raw) + 1)), raw
    for raw in ["Tokyo", "2024-05-01", "None ", " True", "true x", "12 3", "-x", "01"]:
        assert not may_be_literal(raw) and isinstance(xml_value(raw), str), raw


def test_xml_calls_through_the_server_as_the_openai_client_accumulates_them(tmp_path: Path
                                                                           ) -> None:
    """The worker gives the stream the model's format and the tools: the client's
    accumulation of the stream equals the answer not streamed, values typed as it types
    them."""
    text = "Let me see.\n" + QWEN_XML.render(
        [("get_weather", {"city": "Oslo\n</b>", "zip": "10001", "days": 3}),
         ("get_time", {"zone": "Europe/Oslo"})])
    engine = ScriptedEngine([text[i:i + 3] for i in range(0, len(text), 3)], QWEN_XML)
    worker = ApiWorker(lambda: LocalTrees(tmp_path / "a.db"), engine)
    worker.start()
    server = Server(worker, lambda: "scripted", ServerOptions(port=0))
    server.start()
    client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60.0)
    asked: Any = [{"role": "user", "content": "Weather and time in Oslo?"}]
    try:
        whole = client.chat.completions.create(model="", messages=asked, tools=TOOLS)
        with client.chat.completions.stream(model="", messages=asked, tools=TOOLS) as stream:
            chunks = [event.chunk for event in stream if event.type == "chunk"]
            streamed = stream.get_final_completion().choices[0]
    finally:
        client.close()
        server.stop()
        worker.close()
    made = whole.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in made] == \
        [("get_weather", '{"city": "Oslo\\n</b>", "zip": "10001", "days": 3}'),
         ("get_time", '{"zone": "Europe/Oslo"}')]
    assert [(c.function.name, c.function.arguments)
            for c in streamed.message.tool_calls or []] == \
        [(c.function.name, c.function.arguments) for c in made]
    firsts = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()
              if d.id is not None]  # (what arrives together goes out as one delta)
    assert [(d.index, d.type, d.function and d.function.arguments) for d in firsts] == \
        [(0, "function", ""), (1, "function", "")]
