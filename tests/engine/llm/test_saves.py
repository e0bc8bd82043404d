"""Which states a reply's prepare saves on the kinds that cannot cut their cache back: not the
last message's end where the prompt-end state, a few tokens on, serves every path it would."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from engine.core.memory import MemoryKind
from engine.core.results import Source
from engine.core.tree import Role, Tree
from engine.llm.generator import Generator
from engine.llm.llama import SamplingParams
from engine.storage.checkpoints import CheckpointStore
from tests.conftest import RuntimeFactory

GREEDY = SamplingParams(temperature=0.0)
CUT_BACK_NEVER = [MemoryKind.SLIDING_WINDOW, MemoryKind.RECURRENT, MemoryKind.HYBRID]


@pytest.mark.parametrize("kind", CUT_BACK_NEVER, ids=lambda k: k.value)
def test_the_prompt_end_stands_for_the_message_end_and_serves_an_edited_reply(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16)
    store = CheckpointStore(runtime.identity())
    generator = Generator(runtime, sampling=GREEDY, checkpoints=store)
    assert generator.prompts.replies_keep_opening
    tree = Tree("You are terse.")
    user = tree.add_child(tree.root.id, Role.USER, "Tell me about rivers, please.")
    path = tree.path_to(user.id)
    prompt_end = len(generator.prompts.target(path))
    generator.prepare(path)
    generation = generator.generate(max_tokens=6, seed=1)
    runtime.flush_capture()
    ends = list(itertools.accumulate(len(node.tokens or ()) for node in path))
    saved = {checkpoint.n_tokens for checkpoint in store.all()}
    assert prompt_end in saved and ends[0] in saved  # the prompt's end, the system message's
    assert ends[-1] not in saved and ends[-1] < prompt_end

    # The reply, an edit of it, and a message after the edit: restored from the prompt's end.
    reply = tree.add_child(user.id, Role.ASSISTANT, generation.text)
    reply.tokens = generator.reply_tokens(path, generation.tokens, generation.text).tokens
    edited = tree.add_child(user.id, Role.ASSISTANT, "Rivers run to the sea.")
    after = tree.add_child(edited.id, Role.USER, "And lakes?")
    runtime.clear()
    report = generator.prepare(tree.path_to(after.id)).report
    assert (report.source, report.reused_tokens) == (Source.CHECKPOINT, prompt_end)
    answer = generator.generate(max_tokens=6, seed=2)

    cold = Generator(make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16),
                     sampling=GREEDY, use_cache=False)
    cold.prepare(tree.path_to(after.id))
    assert cold.generate(max_tokens=6, seed=2).tokens == answer.tokens
