"""Tool calls and results in the tree, on real llama.cpp and every memory kind: a forced call
is a valid call of an offered tool, its result is a `tool` node, and an edit of the result or
a switch back to the first one decodes only the tail and answers as a full reprocess does."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from engine.core.conversation import Conversation, ReplyJob
from engine.core.errors import UnsupportedRequest
from engine.core.memory import MemoryKind
from engine.core.results import NodeView, ReplyResult
from engine.core.tools import TOOL_CALL_ID, TOOLS, calls_of
from engine.core.tree import Node, NodeStatus, Role, Tree
from engine.llm.generator import Generator
from engine.llm.llama import SamplingParams
from engine.llm.reply import call_sampling, run_reply
from engine.storage.checkpoints import CheckpointStore
from tests.conftest import ALL_KINDS, RuntimeFactory
from tests.helpers import random_tokens

GREEDY = SamplingParams(temperature=0.0)
HOT = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
CITY = {"type": "object", "properties": {"city": {"type": "string",
                                                   "enum": ["Paris", "Oslo", "Lima"]}},
        "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}


def _reply(generator: Generator, conversation: Conversation, parent: int,
           sampling: SamplingParams = GREEDY, max_tokens: int = 8) -> tuple[Node, ReplyResult]:
    start = conversation.start_reply(ReplyJob(parent))
    result = run_reply(generator, [NodeView.of(n).to_node() for n in start.path],
                       max_tokens=max_tokens, seed=3, sampling=sampling)
    conversation.finish_reply(start.reply.id, result)
    return start.reply, result


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_a_tool_loop_edit_and_switch_decode_the_tail_and_match_a_full_reprocess(
    kind: MemoryKind, tool_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tool_models[kind.value], n_ctx=2048, n_batch=32)
    generator = Generator(runtime, sampling=GREEDY,
                          checkpoints=CheckpointStore(runtime.identity()))
    tree = Tree("You help with the weather.")
    tree.root.meta[TOOLS] = [WEATHER]
    conversation = Conversation(tree)
    user = tree.add_child(tree.root.id, Role.USER, "Is it raining in Oslo?")

    call, _ = _reply(generator, conversation, user.id,
                          replace(GREEDY, tool_choice="required"), max_tokens=60)
    (made,) = calls_of(call.meta)
    assert made.name == "get_weather" and call.text == ""  # all it said was the call
    jsonschema.validate(json.loads(made.arguments), CITY)
    assert call.tokens is not None  # the call as the model wrote it, markers and all
    written = b"".join(runtime.model.token_bytes(t, special=True) for t in call.tokens)
    assert b"<tool_call>" in written

    answers: dict[str, tuple[str, int]] = {}
    results: list[Node] = []
    for said in ('{"rain": true, "mm": 4}', '{"rain": false}'):
        tool = tree.add_child(call.id, Role.TOOL, said)
        tool.meta[TOOL_CALL_ID] = made.id
        results.append(tool)
        reply, outcome = _reply(generator, conversation, tool.id)
        answers[said] = (reply.text, outcome.report.decoded_tokens)
    again, outcome = _reply(generator, conversation, results[0].id)  # switch back
    first = answers['{"rain": true, "mm": 4}']
    assert again.text == first[0]
    edited_decoded = answers['{"rain": false}'][1]
    whole = len(generator.prompts.target(tree.path_to(results[1].id)))
    assert edited_decoded < whole // 2  # the tail: the result and the reply's opening
    assert outcome.report.decoded_tokens < whole // 2

    # A reply that had begun a call (under "auto") goes on under the call's grammar: a valid
    # call, the same from the cache as from a cold context.
    begun = tree.add_child(user.id, Role.ASSISTANT, '<tool_call>\n{"name": "get_weather", '
                           '"arguments": {"city": "', status=NodeStatus.INTERRUPTED)
    asked = [NodeView.of(n).to_node() for n in tree.path_to(user.id)]
    going_on = NodeView.of(begun).to_node()
    continued = [run_reply(generator, asked, resume=going_on, max_tokens=60, seed=3,
                           sampling=GREEDY) for _ in range(2)]
    (went_on,) = calls_of(dict(continued[0].meta))
    jsonschema.validate(json.loads(went_on.arguments), CITY)
    assert continued[1].report.decoded_tokens < len(continued[1].tokens) // 2  # cached
    assert continued[1].tokens == continued[0].tokens
    assert calls_of(dict(continued[1].meta))[0].same_call(went_on)

    cold = Generator(make_runtime(tool_models[kind.value], n_ctx=2048, n_batch=32),
                     sampling=GREEDY, use_cache=False)
    for tool in results:
        path = [NodeView.of(n).to_node() for n in tree.path_to(tool.id)]
        fresh = run_reply(cold, path, max_tokens=8, seed=3, sampling=GREEDY)
        assert fresh.text == answers[tool.text][0]
    fresh = run_reply(cold, asked, resume=going_on, max_tokens=60, seed=3, sampling=GREEDY)
    assert fresh.tokens == continued[0].tokens
    assert calls_of(dict(fresh.meta))[0].same_call(went_on)


@pytest.mark.parametrize("sampling", [GREEDY, HOT], ids=["greedy", "hot"])
def test_under_auto_a_reply_that_begins_no_call_is_the_one_without_a_grammar(
    sampling: SamplingParams, tool_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """The call grammar of tool_choice "auto" is lazy: until the reply writes the call
    marker, every token is the one the same sampler draws with no grammar at all."""
    generator = Generator(make_runtime(tool_models["dense"], n_ctx=1024, n_batch=32))
    tree = Tree("You help with the weather.")
    tree.root.meta[TOOLS] = [WEATHER]
    path = tree.path_to(tree.add_child(tree.root.id, Role.USER, "Is it raining in Oslo?").id)
    lazy = call_sampling(sampling, [WEATHER], generator.prompts.tool_format())
    assert lazy.json_lazy is not None and lazy.json_schema is not None
    replies = []
    for drawn in (sampling, lazy):
        generator.prepare(path)
        replies.append(generator.generate(max_tokens=48, seed=9, sampling=drawn))
    assert "<tool_call>" not in replies[0].text and len(replies[0].tokens) > 8
    assert replies[1].tokens == replies[0].tokens
    whole = run_reply(generator, [NodeView.of(n).to_node() for n in path], max_tokens=48,
                      seed=9, sampling=sampling)  # tools offered: "auto" is lazy there too
    assert whole.text == replies[0].text


def test_a_template_without_tools_says_so_and_a_named_choice_must_be_offered(
    tiny_models: dict[str, Path], tool_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    tree = Tree("")
    tree.root.meta[TOOLS] = [WEATHER]
    user = tree.add_child(tree.root.id, Role.USER, "Weather?")
    path = [NodeView.of(n).to_node() for n in tree.path_to(user.id)]
    plain = Generator(make_runtime(tiny_models["dense"], n_ctx=512, n_batch=32))
    with pytest.raises(UnsupportedRequest, match="takes no tools"):
        run_reply(plain, path, max_tokens=4, seed=1)
    tools = Generator(make_runtime(tool_models["dense"], n_ctx=512, n_batch=32))
    with pytest.raises(UnsupportedRequest, match="not among the tools"):
        run_reply(tools, path, max_tokens=4, seed=1,
                  sampling=replace(GREEDY, tool_choice="launch"))


def test_a_special_token_that_opens_calls_shows_in_the_reply_text(
        tiny_models: dict[str, Path], make_runtime: RuntimeFactory) -> None:
    """llama.cpp leaves special tokens out of a reply's text; a vocabulary's call marker
    (Mistral's `[TOOL_CALLS]`, Llama 3's `<|python_tag|>`) is shown, or the call could not be
    read. SmolLM2's vocabulary has none: its `<|im_start|>` stands in for one, forced by a
    logit bias."""
    runtime = make_runtime(tiny_models["dense"], n_ctx=256, n_batch=64)
    model = runtime.model
    assert model.call_markers == frozenset()  # "<tool_call>" is text here, not one token
    (special,) = model.tokenize("<|im_start|>")
    assert model.token_bytes(special) == b"" and not model.is_eog(special)
    forced = SamplingParams(temperature=0.0, logit_bias=((special, 100.0),))
    runtime.prepare(random_tokens(12, seed=1))
    hidden = runtime.generate(max_tokens=2, sampling=forced, seed=1)
    assert hidden.tokens == (special, special) and hidden.text == ""
    model.__dict__["call_markers"] = frozenset({special})  # as a real marker would be
    runtime.prepare(random_tokens(12, seed=1))
    shown = runtime.generate(max_tokens=2, sampling=forced, seed=1)
    assert shown.tokens == hidden.tokens and shown.text == "<|im_start|><|im_start|>"
