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
from engine.core.tree import Node, Role, Tree
from engine.llm.generator import Generator
from engine.llm.llama import SamplingParams
from engine.llm.reply import run_reply
from engine.storage.checkpoints import CheckpointStore
from tests.conftest import ALL_KINDS, RuntimeFactory

GREEDY = SamplingParams(temperature=0.0)
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

    cold = Generator(make_runtime(tool_models[kind.value], n_ctx=2048, n_batch=32),
                     sampling=GREEDY, use_cache=False)
    for tool in results:
        path = [NodeView.of(n).to_node() for n in tree.path_to(tool.id)]
        fresh = run_reply(cold, path, max_tokens=8, seed=3, sampling=GREEDY)
        assert fresh.text == answers[tool.text][0]


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
