"""The families' call formats against the real chat templates llama.cpp keeps for its tests
(tests/fixtures/vendored.py): each template's format is found from its markers, or the
template is refused by name; a call the template writes in a conversation's history reads
back as that call, so the calls a model trained on it writes are read; and a whole tool loop
renders."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine.api.stops import CallHoldback
from engine.core.call_formats import (
    FORMATS,
    LFM2,
    MISTRAL_ARGS,
    QWEN_XML,
    ToolFormat,
    ToolSupport,
    known_format,
    tool_format,
)
from engine.core.prompt import ChatTemplate, TemplateError, short_call_id
from engine.core.tools import ToolCall, valid_call
from tests.fixtures.vendored import template

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                  "zip": {"type": "string"}, "hourly": {"type": "boolean"}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]
ARGUMENTS = {"city": 'Oslo, "NO"', "days": 3}

# The format of each released model's template (None: refused, saying why). Every format
# is here, and the families a user is likeliest to load, with the templates that hold a
# format's marker but write calls in another way.
EXPECTED: dict[str, str | None] = {
    "meta-llama-Llama-3.1-8B-Instruct": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3",
    "Qwen-Qwen2.5-7B-Instruct": "hermes",
    "Qwen-Qwen3-0.6B": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes",
    "ibm-granite-granite-4.0": "hermes",
    "Qwen3.5-4B": "qwen-xml",
    "Qwen3-Coder": "qwen-xml",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "qwen-xml",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral-args",
    "unsloth-mistral-Devstral-Small-2507": "mistral-args",
    "mistralai-Ministral-3-14B-Reasoning-2512": "mistral-args",
    "LFM2-8B-A1B": "lfm2",
    "LFM2.5-Instruct": "lfm2",
    # Other ways of writing calls, refused rather than misread:
    "openai-gpt-oss-120b": None,  # harmony's channels
    "GLM-4.6": None,  # <tool_call>name<arg_key>…
    "MiniMax-M1": None,  # <tool_calls> lines
    "unsloth-Apriel-1.5": None,  # <tool_calls>[…]
    "meetkai-functionary-medium-v3.1": None,  # <function=name>{…}
    "deepseek-ai-DeepSeek-V3.1": None,
    "google-gemma-2-2b-it": None,  # no tools at all
}


def _templates(vendored: Path) -> list[str]:
    return sorted(p.stem for p in (vendored / "templates").glob("*.jinja"))


def accept(name: str, arguments: dict[str, Any]) -> bool:
    return valid_call(TOOLS, name, arguments)


def test_each_released_template_has_its_format_or_is_refused_by_name(vendored: Path) -> None:
    names = _templates(vendored)
    assert len(names) > 40 and set(EXPECTED) <= set(names)
    found = {}
    for name in names:
        source = template(vendored, name)
        try:
            found[name] = tool_format(source).name
        except ToolSupport as exc:
            assert "cannot call" in str(exc) or "does not read" in str(exc)
            found[name] = None
        assert (known_format(source) is None) == (found[name] is None)
    assert {name: found[name] for name in EXPECTED} == EXPECTED
    assert {f.name for f in FORMATS} <= set(found.values())  # each format is some model's


def _history_call_text(chat: ChatTemplate, call: ToolCall) -> str:
    """What the template writes for `call` in a reply of the history: the difference from
    the same conversation whose reply said a sentence instead."""
    head = [{"role": "system", "content": "You help."},
            {"role": "user", "content": "Weather in Oslo?"}]
    with_call = chat.render([*head, {"role": "assistant", "content": "",
                                     "tool_calls": [call.to_template()]}],
                            add_generation_prompt=False, tools=TOOLS)
    with_text = chat.render([*head, {"role": "assistant", "content": "Sentinel."}],
                            add_generation_prompt=False, tools=TOOLS)
    start = 0
    while with_call[start] == with_text[start]:
        start += 1
    end = 0
    while with_call[-1 - end] == with_text[-1 - end]:
        end += 1
    return with_call[start:len(with_call) - end]


def test_a_call_each_template_writes_in_the_history_reads_back_as_that_call(
    vendored: Path
) -> None:
    read = 0
    for name in _templates(vendored):
        source = template(vendored, name)
        calling = known_format(source)
        if calling is None:
            continue
        chat = ChatTemplate(source, bos_text="<s>", eos_text="</s>")
        call = ToolCall.new("get_weather", ARGUMENTS)
        written = _history_call_text(chat, call)
        said, calls = calling.parse(written, accept)
        assert calls == [("get_weather", ARGUMENTS)], (name, written)
        assert said.strip() == "", (name, said)
        # The whole loop renders: the call, its result, the answer and the next question.
        loop = [{"role": "system", "content": "You help."},
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [call.to_template()]},
                {"role": "tool", "content": '{"rain": true}', "tool_call_id": call.id},
                {"role": "assistant", "content": "It rains."},
                {"role": "user", "content": "And tomorrow?"}]
        text = chat.render(loop, add_generation_prompt=True, tools=TOOLS)
        assert "rain" in text and "It rains." in text, name  # (Llama 3.1 quotes it)
        read += 1
    assert read >= len([v for v in EXPECTED.values() if v])


@pytest.mark.parametrize("calling", FORMATS, ids=lambda f: f.name)
def test_each_format_reads_what_it_writes(calling: ToolFormat) -> None:
    calls = [("get_weather", {"city": "Zürich", "hourly": True, "zip": "8001"}),
             ("get_time", {})]
    if calling.at_open:  # Llama 3: a reply that is one call
        assert calling.parse(calling.render(calls[:1]), accept) == ("", calls[:1])
        return
    assert calling.parse("Let me see. " + calling.render(calls), accept) == ("Let me see.",
                                                                            calls)


def test_xml_values_are_typed_as_the_schema_takes_them() -> None:
    text = ("I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan José\n"
            "</parameter>\n<parameter=zip>\n0150\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n<parameter=hourly>\nFalse\n</parameter>\n</function>\n</tool_call>"
            "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>")
    said, calls = QWEN_XML.parse(text, accept)
    assert said == "I will check."
    assert calls == [("get_weather", {"city": "San José", "zip": "0150", "days": 3,
                                      "hourly": False}), ("get_time", {})]
    wrong = text.replace("<parameter=days>\n3\n", "<parameter=days>\nthree\n")
    assert QWEN_XML.parse(wrong, accept)[1] == [("get_time", {})]  # the bad one stays text


def test_python_like_calls_are_read_never_run() -> None:
    said, calls = LFM2.parse('<|tool_call_start|>[get_weather(city="Oslo", hourly=true), '
                             'get_time()]<|tool_call_end|>Checking.', accept)
    assert calls == [("get_weather", {"city": "Oslo", "hourly": True}), ("get_time", {})]
    assert said == "Checking."
    for text in ['<|tool_call_start|>[get_weather(city=__import__("os").name)]'
                 '<|tool_call_end|>',
                 '<|tool_call_start|>[get_weather("Oslo")]<|tool_call_end|>',  # positional
                 '<|tool_call_start|>[os.system(city="x")]<|tool_call_end|>',
                 '<|tool_call_start|>get_weather(city="Oslo")<|tool_call_end|>']:
        assert LFM2.parse(text, accept) == (text, [])
    # A vocabulary may hold the end marker as a special token a reply's text leaves out.
    assert LFM2.parse('<|tool_call_start|>[get_time()]', accept) == ("", [("get_time", {})])


def test_mistral_names_then_arguments_with_or_without_a_call_id() -> None:
    text = ('[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Oslo"}'
            '[TOOL_CALLS]get_time[ARGS]{}')
    assert MISTRAL_ARGS.parse(text, accept) == ("", [("get_weather", {"city": "Oslo"}),
                                                     ("get_time", {})])
    broken = '[TOOL_CALLS]get_weather[ARGS]{"city": 7}'
    assert MISTRAL_ARGS.parse(broken, accept) == (broken, [])


def test_call_ids_are_shortened_for_mistral_templates_and_still_match(vendored: Path) -> None:
    ids = {short_call_id(f"call_{n:024x}") for n in range(200)}
    assert len(ids) == 200 and all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)
    assert short_call_id("call_abc") == short_call_id("call_abc")
    assert short_call_id("a1B2c3D4e") == "a1B2c3D4e"
    call = ToolCall.new("get_weather", {"city": "Oslo"})
    chat = ChatTemplate(template(vendored, "mistralai-Mistral-Nemo-Instruct-2407"))
    text = chat.render([{"role": "user", "content": "Weather?"},
                        {"role": "assistant", "content": "", "tool_calls": [call.to_template()]},
                        {"role": "tool", "content": "rain", "tool_call_id": call.id}],
                       add_generation_prompt=True, tools=TOOLS)
    assert text.count(short_call_id(call.id)) == 2 and call.id not in text


def test_templates_may_use_loop_controls_and_generation_blocks() -> None:
    chat = ChatTemplate("{% for m in messages %}{% if m.role == 'system' %}{% continue %}"
                        "{% endif %}{% generation %}[{{ m.content }}]{% endgeneration %}"
                        "{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}")
    messages = [{"role": r, "content": c}
                for r, c in [("system", "s"), ("user", "a"), ("assistant", "b"), ("user", "c")]]
    assert chat.render(messages, add_generation_prompt=False) == "[a][b]"
    with pytest.raises(TemplateError, match="invalid"):
        ChatTemplate("{% generation %}never closed")


def test_a_template_that_reads_no_tool_calls_gets_them_in_the_reply_text(
    vendored: Path
) -> None:
    """LFM2's templates render a reply's text as it is: its calls are written into it."""
    chat = ChatTemplate(template(vendored, "LFM2.5-Instruct"))
    call = ToolCall.new("get_weather", {"city": "Oslo"})
    text = chat.render([{"role": "user", "content": "Weather?"},
                        {"role": "assistant", "content": "Checking.",
                         "tool_calls": [call.to_template()]}],
                       add_generation_prompt=False, tools=TOOLS)
    assert 'Checking.<|tool_call_start|>[get_weather(city="Oslo")]<|tool_call_end|>' in text


def test_the_stream_holds_back_only_what_may_still_begin_a_marker() -> None:
    held = CallHoldback([m for f in FORMATS for m in f.shown])
    assert held.feed("Sunny all week") == "Sunny all week"
    assert held.feed(", I think <") == ", I think "  # "<" may begin "<tool_call>"
    assert held.feed("3 degrees") == "<3 degrees"
    assert held.feed(" [TOOL") == " "
    assert held.feed("_CALLS]") == "" and held.calling and held.marker == "[TOOL_CALLS]"


def test_parsed_arguments_are_the_calls_json() -> None:
    """What a format reads is what the call keeps (`ToolCall.new`), whichever format."""
    for calling in FORMATS:
        text = calling.render([("get_weather", {"city": "Oslo"})])
        _said, ((name, arguments),) = calling.parse(text, accept)
        assert json.loads(ToolCall.new(name, arguments).arguments) == {"city": "Oslo"}


def test_stop_sequences_hold_back_only_what_may_still_begin_one() -> None:
    from engine.api.stops import StopScanner

    stops = StopScanner(["\nUser:", "###"])
    assert stops.feed("Fine, thanks") == "Fine, thanks"
    assert stops.feed(".\nUs") == "."
    assert stops.feed("ually") == "\nUsually"
    assert stops.feed(" ##") == " " and stops.feed("#") == "" and stops.hit
    assert stops.text == "Fine, thanks.\nUsually "
