"""Which states a reply's prepare saves, and when: on the kinds that cannot cut their cache back
not the last message's end where the prompt-end state, a few tokens on, serves every path it
would; on a dense cache the prompt's end once the reply is over."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from engine.core.memory import MemoryKind
from engine.core.results import Source
from engine.core.tree import Role, Tree
from engine.llm.generator import Generator
from engine.llm.llama import SamplingParams
from engine.storage.checkpoints import Checkpoint, CheckpointStore
from tests.conftest import RuntimeFactory
from tests.helpers import random_tokens

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


@pytest.mark.parametrize("kind", list(MemoryKind), ids=lambda k: k.value)
def test_the_whole_prompt_end_state_waits_for_the_reply_where_it_can_be_rebuilt(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """On a dense cache the prompt-end checkpoint (the whole KV cache) waits until the reply
    is over, so it never holds up the reply's second token; cutting the reply's cells off
    then gives exactly the state a capture at the prompt's end gives. On a hybrid the partial
    twin is taken at the first token and the whole state after the reply, rebuilt from the
    twin and the attention cache cut back. The other kinds take it by the first token, as
    their state moves on with the reply."""
    target, marks = random_tokens(100), [60]
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16)
    twin = runtime.cheap_partials  # what the generator asks for (`twin_end`)
    kept: list[Checkpoint] = []
    runtime.prepare(target, marks=marks, save_at=[100], on_checkpoint=kept.append,
                    twin_end=twin)
    first = runtime.generate(max_tokens=8, sampling=GREEDY, seed=1)
    assert len(first.tokens) > 1 and len(runtime.live_tokens) > len(target)
    waits = kind in (MemoryKind.DENSE, MemoryKind.HYBRID)
    assert runtime.captures_after_reply is (kind is MemoryKind.DENSE)
    assert twin is (kind is MemoryKind.HYBRID)
    assert [c.partial for c in kept] == ([True] if twin else [] if waits else [False])
    runtime.flush_capture()  # the engine's after_reply
    checkpoint = next(c for c in kept if not c.partial)
    assert checkpoint.tokens == tuple(target) and checkpoint.logits is not None
    if not waits:
        return
    assert runtime.live_tokens == tuple(target)  # the reply cut off

    direct: list[Checkpoint] = []  # taken at the prompt's end, in a context without a reply
    other = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16)
    other.prepare(target, marks=marks, save_at=[100], on_checkpoint=direct.append)
    other.flush_capture()
    assert (checkpoint.blob, checkpoint.logits) == (direct[0].blob, direct[0].logits)
    other.clear()
    restored = other.prepare(target, marks=marks, checkpoints=[checkpoint])
    assert (restored.source, restored.decoded_tokens) == (Source.CHECKPOINT, 0)
    assert other.generate(max_tokens=8, sampling=GREEDY, seed=1).tokens == first.tokens
    swipe = runtime.prepare(target, marks=marks)  # the live cache, with the kept logits
    assert (swipe.source, swipe.decoded_tokens) == (Source.LIVE, 0)
    assert runtime.generate(max_tokens=8, sampling=GREEDY, seed=1).tokens == first.tokens
