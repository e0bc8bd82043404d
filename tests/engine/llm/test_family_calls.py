"""Tool calls in each family's own format, on real llama.cpp: released models' chat templates
and, where llama.cpp keeps one, their family's vocabulary (tests/fixtures/vendored.py).

The vocabularies llama.cpp keeps are of the families' first releases, which named the tokens
later releases call with reserved or padding names: Llama 3's reserved token 128010 is Llama
3.1's `<|python_tag|>` (a control token, which llama.cpp leaves out of a reply's text), Qwen2's
padding token 151657 is Qwen 2.5's and 3.5's `<tool_call>` (a user-defined token). The models
here are the first vocabularies with those tokens named as the later releases name them.
LFM2 and Mistral's newer vocabularies are not among them: their templates run over
SmolLM2's and Llama 2's.

On every family and a memory kind each: a forced call is a valid call of the offered tool; a
reply that has begun a call (under "auto") goes on under the format's grammar to a valid
call; and the answer to the call's result is the one a full reprocess gives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import gguf
import jsonschema
import pytest

from engine.bench.random_models import ModelKind, write_tiny_model
from engine.core.memory import MemoryKind
from engine.core.results import FinishReason, NodeView
from engine.core.tools import TOOL_CALL_ID, TOOLS, calls_of
from engine.core.tree import NodeStatus, Role, Tree
from engine.llm.generator import Generator
from engine.llm.llama import SamplingParams
from engine.llm.reply import run_reply
from engine.storage.checkpoints import CheckpointStore
from tests.conftest import RuntimeFactory
from tests.fixtures.vendored import template

GREEDY = SamplingParams(temperature=0.0)
CITY = {"type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                       "days": {"type": "integer"}},
        "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather",
                                            "description": "The weather in a city.",
                                            "parameters": CITY}}
CONTROL, USER_DEFINED = gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED


@dataclass(frozen=True)
class Family:
    format: str
    template: str
    vocabulary: str | None  # a vendored vocabulary; None: SmolLM2's
    kind: MemoryKind
    begun: str  # what a reply that has begun a call wrote
    renamed: dict[int, tuple[str, gguf.TokenType]] = field(default_factory=dict)
    hidden: str = ""  # a marker the vocabulary holds as a control token
    reasons: bool = False  # the generation prompt opens the reply's reasoning (`<think>`)


FAMILIES = [
    Family("llama3", "meta-llama-Llama-3.1-8B-Instruct", "llama-bpe", MemoryKind.DENSE,
           "<|python_tag|>", {128008: ("<|eom_id|>", CONTROL),
                              128010: ("<|python_tag|>", CONTROL)}, hidden="<|python_tag|>"),
    Family("qwen-xml", "Qwen3.5-4B", "qwen35", MemoryKind.HYBRID,
           "<tool_call>\n<function=get_weather>\n",
           {151657: ("<tool_call>", USER_DEFINED), 151658: ("</tool_call>", USER_DEFINED)},
           reasons=True),
    Family("hermes", "Qwen-Qwen2.5-7B-Instruct", "qwen2", MemoryKind.SLIDING_WINDOW,
           '<tool_call>\n{"name": "get_weather", "arguments": {"city": "',
           {151657: ("<tool_call>", USER_DEFINED), 151658: ("</tool_call>", USER_DEFINED)}),
    Family("lfm2", "LFM2.5-Instruct", None, MemoryKind.RECURRENT,
           "<|tool_call_start|>[get_weather(city="),
    Family("mistral-args", "Mistral-Small-3.2-24B-Instruct-2506", "llama-spm",
           MemoryKind.SLIDING_WINDOW, "[TOOL_CALLS]get_weather"),
]


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory, vendored: Path,
                  smollm2_path: Path) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("families")
    return {
        family.format: write_tiny_model(
            ModelKind(family.kind.value), out / f"{family.format}.gguf",
            vendored / f"ggml-vocab-{family.vocabulary}.gguf" if family.vocabulary
            else smollm2_path,
            chat_template=template(vendored, family.template), renamed_tokens=family.renamed)
        for family in FAMILIES
    }


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.format)
def test_a_family_calls_in_its_own_format_and_its_answer_matches_a_full_reprocess(
    family: Family, family_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    path = family_models[family.format]
    runtime = make_runtime(path, n_ctx=2048, n_batch=32)
    generator = Generator(runtime, sampling=GREEDY,
                          checkpoints=CheckpointStore(runtime.identity()))
    assert generator.prompts.tool_format().name == family.format
    if family.hidden:  # a control token: llama.cpp leaves it out, Arbor shows it
        (token,) = runtime.model.tokenize(family.hidden)
        assert runtime.model.token_bytes(token) == b""
        assert token in runtime.model.call_markers
    tree = Tree("You help with the weather.")
    tree.root.meta[TOOLS] = [WEATHER]
    user = tree.add_child(tree.root.id, Role.USER, "Is it raining in Oslo?")
    asked = [NodeView.of(n).to_node() for n in tree.path_to(user.id)]

    required = replace(GREEDY, tool_choice="required")
    assert generator.reasoning_closer(asked) == ("</think>" if family.reasons else None)
    if family.reasons:
        # A reply that starts inside its reasoning reasons freely (as under "auto") and
        # calls once its reasoning ends; after the call it ends.
        free = run_reply(generator, asked, max_tokens=12, seed=3, sampling=required)
        auto = run_reply(generator, asked, max_tokens=12, seed=3, sampling=GREEDY)
        assert free.tokens == auto.tokens
        assert not calls_of(dict(free.meta))
        reasoned = tree.add_child(user.id, Role.ASSISTANT, "I'll look it up.\n</think>\n\n",
                                  status=NodeStatus.INTERRUPTED)
        forced = run_reply(generator, asked, resume=NodeView.of(reasoned).to_node(),
                           max_tokens=80, seed=3, sampling=required)
        assert forced.report.finish is FinishReason.STOP
        assert forced.text.startswith("I'll look it up.\n</think>")
        # JSON output likewise: after the reasoning, the answer is the JSON.
        as_json = run_reply(generator, asked, resume=NodeView.of(reasoned).to_node(),
                            max_tokens=120, seed=3,
                            sampling=replace(GREEDY, json_schema=json.dumps(CITY)))
        assert as_json.report.finish is FinishReason.STOP
        jsonschema.validate(json.loads(as_json.text.split("</think>", 1)[1]), CITY)
    else:
        forced = run_reply(generator, asked, max_tokens=80, seed=3, sampling=required)
    (made,) = calls_of(dict(forced.meta))
    assert made.name == "get_weather"
    jsonschema.validate(json.loads(made.arguments), CITY)

    # Under "auto", a reply that has begun a call goes on under the format's grammar.
    begun = tree.add_child(user.id, Role.ASSISTANT, family.begun,
                           status=NodeStatus.INTERRUPTED)
    going_on = NodeView.of(begun).to_node()
    went_on = run_reply(generator, asked, resume=going_on, max_tokens=80, seed=3,
                        sampling=GREEDY)
    (continued,) = calls_of(dict(went_on.meta))
    jsonschema.validate(json.loads(continued.arguments), CITY)

    # The call kept, its result answered: the answer is a full reprocess's.
    call = tree.add_child(user.id, Role.ASSISTANT, forced.text)
    call.meta.update(dict(forced.meta))
    call.tokens = list(forced.tokens)
    result = tree.add_child(call.id, Role.TOOL, '{"rain": true, "mm": 4}')
    result.meta[TOOL_CALL_ID] = made.id
    path_to_result = [NodeView.of(n).to_node() for n in tree.path_to(result.id)]
    answer = run_reply(generator, path_to_result, max_tokens=8, seed=3, sampling=GREEDY)
    assert answer.report.decoded_tokens < len(generator.prompts.target(path_to_result))

    cold = Generator(make_runtime(path, n_ctx=2048, n_batch=32), sampling=GREEDY,
                     use_cache=False)
    assert run_reply(cold, path_to_result, max_tokens=8, seed=3,
                     sampling=GREEDY).tokens == answer.tokens
    again = run_reply(cold, asked, resume=going_on, max_tokens=80, seed=3, sampling=GREEDY)
    assert again.tokens == went_on.tokens
