"""Tool calls streamed as OpenAI's `tool_calls` deltas while the model writes them: however
the text comes in pieces and however the model spaces and escapes its JSON, the deltas of a
call add up to the arguments the finished reply's call has, and none is taken back."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from openai import OpenAI

from engine.api.calls import CallDelta, CallStream
from engine.api.server import Server, ServerOptions
from engine.api.trees import LocalTrees
from engine.api.worker import ApiWorker
from engine.config.params import SamplingParams
from engine.core.call_formats import FORMATS, HERMES, ToolFormat
from engine.core.results import FinishReason, Outcome, ReplyReport, ReplyResult, Source
from engine.core.tools import TOOL_CALLS, ToolCall, tools_of, valid_call
from engine.core.tree import Node
from engine.llm.reply import CancelFn, PieceFn
from engine.service.protocol import ModelLoaded
from engine.storage.store import Store

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=8)
ARGUMENTS = st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4)


def _written(value: Any, style: int) -> str:
    """`value` as a model may write it: spaced, indented, or escaping all but ASCII."""
    match style:
        case 0:
            return json.dumps(value, separators=(",", ":"))
        case 1:
            return json.dumps(value, indent=2, ensure_ascii=False)
        case _:
            return json.dumps(value, separators=(", ", " : "))


def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def _accumulate(stream: CallStream, pieces: list[str]) -> tuple[str, list[CallDelta]]:
    content, deltas = "", []
    for piece in pieces:
        said, more = stream.feed(piece)
        content += said
        deltas += more
    return content, deltas


def _calls(deltas: list[CallDelta]) -> list[dict[str, str]]:
    """What a client accumulates, as the openai library does: by index."""
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        if delta.id is not None:
            assert delta.index not in calls and delta.index == len(calls)
            assert delta.arguments == ""
            calls[delta.index] = {"id": delta.id, "name": delta.name or "", "arguments": ""}
        else:
            calls[delta.index]["arguments"] += delta.arguments
    return [calls[i] for i in sorted(calls)]


@settings(max_examples=300, deadline=None)
@given(first=ARGUMENTS, second=ARGUMENTS, style=st.integers(0, 2),
       cuts=st.lists(st.integers(0, 10**6), max_size=40))
def test_hermes_calls_stream_to_the_arguments_the_reply_makes(
    first: dict[str, Any], second: dict[str, Any], style: int, cuts: list[int]
) -> None:
    objects = [{"name": "get_weather", "arguments": first},
               {"arguments": second, "name": "note"}]  # the name last: its deltas wait
    text = "Let me look.\n" + "\n".join(f"<tool_call>\n{_written(o, style)}\n</tool_call>"
                                        for o in objects)
    stream = CallStream(FORMATS)
    content, deltas = _accumulate(stream, _pieces(text, cuts))
    assert content == "Let me look.\n"
    made = [ToolCall.new(o["name"], o["arguments"]) for o in objects]  # as the engine makes
    assert [(c["name"], c["arguments"]) for c in _calls(deltas)] == \
        [(m.name, m.arguments) for m in made]
    owed, named = stream.finish(made)
    assert owed == []
    assert [c.id for c in named] == [c["id"] for c in _calls(deltas)]


@settings(max_examples=200, deadline=None)
@given(arguments=ARGUMENTS, cut=st.integers(0, 10**6), style=st.integers(0, 2))
def test_a_call_cut_short_streams_a_prefix_and_the_rest_comes_at_the_end(
    arguments: dict[str, Any], cut: int, style: int
) -> None:
    """What was streamed of a call is a prefix of its arguments (a number only once it has
    ended, an escape only once whole); `finish` sends the rest."""
    text = f'<tool_call>{{"name": "f", "arguments": {_written(arguments, style)}}}</tool_call>'
    stream = CallStream(FORMATS)
    _content, deltas = _accumulate(stream, _pieces(text[: cut % len(text)], [cut // 7]))
    made = ToolCall.new("f", arguments)
    for call in _calls(deltas):
        assert made.arguments.startswith(call["arguments"])
    owed, (named,) = stream.finish([made])
    assert _calls(deltas + owed) == [{"id": named.id, "name": "f",
                                      "arguments": made.arguments}]


def test_numbers_escapes_and_surrogates_wait_until_they_are_whole() -> None:
    stream = CallStream(FORMATS)
    sent: list[str] = []
    for piece in ['<tool_call>{"name": "f", "arguments": {"n": 1', "e5", ', "s": "a\\u', "00e9",
                  "\\ud83d", "\\ude00", '\\n"}}</tool_call>']:
        sent.append("".join(d.arguments for d in stream.feed(piece)[1]))
    assert sent == ['{"n": ', "", '100000.0, "s": "a', "é", "", "😀", '\\n"}']


def test_mistral_lists_and_llama3_objects_and_parallel_off() -> None:
    mistral = CallStream(FORMATS)
    _content, deltas = _accumulate(mistral, ['[TOOL_CALLS] [{"name": "a", "arguments": {}}',
                                             ', {"name": "b", "arguments": {"x": [1, 2]}}]'])
    assert [(c["name"], c["arguments"]) for c in _calls(deltas)] == [("a", "{}"),
                                                                     ("b", '{"x": [1, 2]}')]
    llama = CallStream(FORMATS)
    content, deltas = _accumulate(llama, ['  {"name": "a", "parameters": "{\\"q\\": 1}"}'])
    assert content == "" and [(c["name"], c["arguments"]) for c in _calls(deltas)] == \
        [("a", '{"q": 1}')]  # arguments as a JSON string: whole once read, as parsed
    one = CallStream(FORMATS, parallel=False)
    _content, deltas = _accumulate(one, ['<tool_call>{"name": "a", "arguments": {}}'
                                         '</tool_call><tool_call>{"name": "b", "arguments": '
                                         '{}}</tool_call>'])
    assert [c["name"] for c in _calls(deltas)] == ["a"]


def test_a_call_not_streamed_comes_whole_and_one_not_made_stays() -> None:
    """The finished reply's calls are the word: one the stream missed comes whole at the
    end (after those streamed); one streamed that the reply did not make is not taken back
    (its index is simply not among the reply's calls)."""
    stream = CallStream(FORMATS)
    _content, deltas = _accumulate(stream, ['<tool_call>{"name": "bad", "arguments": {"x": 1}}'
                                            '</tool_call>'])
    made = ToolCall.new("get_weather", {"city": "Oslo"})
    assert not valid_call([], "bad", {"x": 1})
    owed, (named,) = stream.finish([made])
    assert named == made and [d.index for d in owed] == [1, 1]
    assert _calls(deltas + owed)[1] == {"id": made.id, "name": "get_weather",
                                        "arguments": made.arguments}


def test_text_that_only_looks_like_a_call_streams_nothing() -> None:
    stream = CallStream(FORMATS)
    content, deltas = _accumulate(stream, ["Use <tool_call> tags", " like this."])
    assert content == "Use " and deltas == []  # held back from the marker on, as before


# --- through the server, with the official client ---------------------------------------------


class ScriptedEngine:
    """An `EngineSide` whose every reply is `pieces` (its calls, in the `calling` format,
    parsed out as the engine parses them): the stream's deltas come from the worker and
    server under test."""

    def __init__(self, pieces: list[str], calling: ToolFormat = HERMES) -> None:
        self.pieces = pieces
        self.calling = calling

    def loaded(self) -> ModelLoaded:
        return ModelLoaded("scripted", "scripted.gguf", "llama", "dense", "CPU", 1024, (),
                           tool_format=self.calling.name)

    def wait_turn(self, cancel: CancelFn) -> None:
        pass

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=0.0)

    def base_seed(self) -> int | None:
        return 0

    def reply(self, path: Sequence[Node], *, max_tokens: int, seed: int, on_piece: PieceFn,
              cancel: CancelFn, sampling: SamplingParams, scope: str, conversation_id: int,
              resume: Node | None = None) -> Outcome:
        for piece in self.pieces:
            on_piece(piece)
        text = "".join(self.pieces)
        tools = tools_of(path[0].meta) or []
        said, calls = self.calling.parse(text, lambda name, arguments: valid_call(
            tools, name, arguments))
        meta = {TOOL_CALLS: [ToolCall.new(name, arguments).to_meta()
                             for name, arguments in calls]}
        report = ReplyReport(prompt_tokens=10, reused_tokens=0, decoded_tokens=10,
                             source=Source.NONE, checkpoint_pos=None, prefill_ms=1.0,
                             generated_tokens=len(self.pieces), finish=FinishReason.STOP)
        return ReplyResult(said, tuple(range(len(self.pieces))), tuple(meta.items()), (),
                           report)

    def warm_while(self, path: Sequence[Node], idle: Callable[[], bool], scope: str
                   ) -> ReplyReport | None:
        return None

    def recover(self) -> None:
        pass

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass


TWO_CALLS = ["I will check both.", "\n<tool", "_call>\n{\"na", 'me": "get_weather", "argum',
             'ents": {"city": "Os', 'lo", "days": 1', "2}}\n</tool_call>\n<tool_call>\n",
             '{"name": "get_time", "arguments": {"zone": "Europe/Os', 'lo\\u00e9"}}',
             "\n</tool_call>"]
TOOL_LIST = [{"type": "function", "function": {"name": name}}
             for name in ("get_weather", "get_time")]


def test_parallel_calls_stream_as_the_openai_client_accumulates_them(tmp_path: Path) -> None:
    """Two Hermes calls in one reply: the client's accumulation of the stream (the official
    library's) has the calls of the reply made whole, ids included, and the tree keeps the
    ids the client got; the text before them is content."""
    engine = ScriptedEngine(TWO_CALLS)
    worker = ApiWorker(lambda: LocalTrees(tmp_path / "a.db"), engine)
    worker.start()
    server = Server(worker, lambda: "scripted", ServerOptions(port=0))
    server.start()
    client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60.0)
    asked: Any = [{"role": "user", "content": "Weather and time in Oslo?"}]
    try:
        whole = client.chat.completions.create(model="", messages=asked,
                                               tools=TOOL_LIST)  # type: ignore[arg-type]
        with client.chat.completions.stream(model="", messages=asked,
                                            tools=TOOL_LIST) as stream:  # type: ignore[arg-type]
            chunks = [event.chunk for event in stream if event.type == "chunk"]
            streamed = stream.get_final_completion().choices[0]
    finally:
        client.close()
        server.stop()
        worker.close()
    made = whole.choices[0].message.tool_calls
    assert [c.function.name for c in made] == ["get_weather", "get_time"]
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in made]
    assert whole.choices[0].message.content == "I will check both."
    assert streamed.message.content == "I will check both.\n"  # as it came, before the call
    assert streamed.finish_reason == whole.choices[0].finish_reason == "tool_calls"
    firsts = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()
              if d.id is not None]
    assert [(d.index, d.type, d.function.arguments) for d in firsts] == \
        [(0, "function", ""), (1, "function", "")]
    with Store(tmp_path / "a.db") as store:
        (info,) = store.list()
        kept = store.load(info.id).messages()[-1].meta[TOOL_CALLS]
    assert [c["id"] for c in kept] == [c.id for c in streamed.message.tool_calls]
