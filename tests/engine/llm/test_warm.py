"""Warming: preparing the likely next prompt while the user reads, so Send decodes only the
new message, and a warm-up cancelled at any point leaves replies exactly as from scratch."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.conversation import Conversation
from engine.core.errors import Cancelled
from engine.core.memory import MemoryKind
from engine.core.results import Reuse, Source
from engine.core.tree import Node, NodeStatus, Role, Tree
from engine.llm.generator import Generator
from engine.llm.llama import SamplingParams
from engine.llm.reply import run_reply
from engine.storage.checkpoints import CheckpointStore
from tests.conftest import ALL_KINDS, RuntimeFactory

SAMPLING = SamplingParams(temperature=0.8)
GREEDY = SamplingParams(temperature=0.0)


def _reply(generator: Generator, tree: Tree, parent: int, seed: int) -> tuple[int, str, int]:
    """Answer `parent` as the app does; returns (reply id, text, tokens decoded to prepare)."""
    path = tree.path_to(parent)
    prepared = generator.prepare(path)
    generation = generator.generate(max_tokens=8, seed=seed)
    reply = tree.add_child(parent, Role.ASSISTANT, generation.text)
    reply.tokens = generator.reply_tokens(path, generation.tokens, generation.text).tokens
    return reply.id, generation.text, prepared.report.decoded_tokens


def _conversation(generator: Generator) -> tuple[Tree, int]:
    tree = Tree("You are terse.")
    user = tree.add_child(tree.root.id, Role.USER, "Tell me about rivers, please.")
    reply, _, _ = _reply(generator, tree, user.id, seed=1)
    return tree, reply


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_after_warming_send_decodes_only_the_new_message_and_the_reply_is_unchanged(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    texts: list[str] = []
    for warm in (True, False):
        runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16)
        generator = Generator(runtime, sampling=SAMPLING,
                              checkpoints=CheckpointStore(runtime.identity()))
        tree, reply = _conversation(generator)
        if warm:
            report = generator.warm(tree.path_to(reply))
            assert report is not None and report.decoded_tokens >= 2
            assert generator.warm(tree.path_to(reply)) is None  # nothing left to do
        user = tree.add_child(reply, Role.USER, "And lakes?")
        _, text, decoded = _reply(generator, tree, user.id, seed=7)
        new_part = len(user.tokens or ()) + len(generator.prompts.generation_prompt(
            tree.path_to(user.id)))
        if warm:
            assert decoded == new_part
        else:
            assert decoded > new_part  # the reply before it was decoded again, batched
        texts.append(text)
    # The invariant against a context that never saw this conversation.
    fresh = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16)
    cold = Generator(fresh, sampling=SAMPLING, use_cache=False)
    tree, reply = _conversation(cold)
    user = tree.add_child(reply, Role.USER, "And lakes?")
    texts.append(_reply(cold, tree, user.id, seed=7)[1])
    assert texts[0] == texts[1] == texts[2]


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize("after_checks", [0, 1, 2, 3])
def test_a_warm_up_cancelled_anywhere_leaves_the_next_reply_exact(
    kind: MemoryKind, after_checks: int, tiny_models: dict[str, Path],
    make_runtime: RuntimeFactory,
) -> None:
    """Cancelled before its first chunk, between chunks, or inside one (llama.cpp's abort)."""
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=8)
    generator = Generator(runtime, sampling=SAMPLING,
                          checkpoints=CheckpointStore(runtime.identity()))
    tree, reply = _conversation(generator)
    calls = 0

    def cancel() -> bool:
        nonlocal calls
        calls += 1
        return calls > after_checks

    with pytest.raises(Cancelled):
        generator.warm(tree.path_to(reply), cancel=cancel)
    user = tree.add_child(reply, Role.USER, "And lakes?")
    _, text, _ = _reply(generator, tree, user.id, seed=7)

    fresh = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=8)
    cold = Generator(fresh, sampling=SAMPLING, use_cache=False)
    tree2, reply2 = _conversation(cold)
    user2 = tree2.add_child(reply2, Role.USER, "And lakes?")
    assert text == _reply(cold, tree2, user2.id, seed=7)[1]


def test_prepare_reports_its_plan_before_decoding(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models["recurrent"], n_ctx=1024, n_batch=16)
    generator = Generator(runtime, sampling=SAMPLING,
                          checkpoints=CheckpointStore(runtime.identity()))
    tree, reply = _conversation(generator)
    user = tree.add_child(reply, Role.USER, "And lakes?")
    plans: list[Reuse] = []
    progress: list[tuple[int, int]] = []
    prepared = generator.prepare(
        tree.path_to(user.id),
        on_plan=plans.append,
        on_progress=lambda done, total: progress.append((done, total)),
    )
    report = prepared.report
    assert plans == [report.reuse]
    assert report.source is Source.CHECKPOINT  # the recurrent state restored at the prompt end
    assert progress[-1] == (report.decoded_tokens, report.decoded_tokens)


def _interrupted(generator: Generator) -> tuple[Conversation, Node]:
    """A conversation whose reply was stopped after three pieces, as the app keeps it."""
    conversation = Conversation(Tree("You are terse."))
    job = conversation.send("Tell me a long story about rivers.").reply
    assert job is not None
    start = conversation.start_reply(job)
    pieces: list[str] = []
    result = run_reply(generator, start.path, max_tokens=40, seed=3, on_piece=pieces.append,
                       cancel=lambda: len(pieces) >= 3)
    conversation.finish_reply(start.reply.id, result)
    assert start.reply.status is NodeStatus.INTERRUPTED
    return conversation, start.reply


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_a_warmed_continue_decodes_nothing_and_equals_a_cold_continue(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16)
    generator = Generator(runtime, sampling=GREEDY,
                          checkpoints=CheckpointStore(runtime.identity()))
    conversation, reply = _interrupted(generator)
    path, resume = conversation.warm_target()
    assert resume is reply and path == conversation.tree.path_to(reply.parent or 0)
    report = generator.warm(path, resume=resume)
    assert report is not None and report.decoded_tokens > 0  # the reply's tokens, batched
    assert generator.warm(path, resume=resume) is None  # nothing left to do

    job = conversation.continue_reply().reply
    assert job is not None
    start = conversation.start_reply(job)
    warmed = run_reply(generator, start.path, resume=start.resume, max_tokens=8, seed=5)
    assert warmed.report.decoded_tokens == 0
    assert warmed.report.reused_tokens == warmed.report.prompt_tokens == report.prompt_tokens

    cold = Generator(make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16),
                     sampling=GREEDY, use_cache=False)
    fresh = run_reply(cold, start.path, resume=start.resume, max_tokens=8, seed=5)
    assert fresh.report.decoded_tokens == fresh.report.prompt_tokens
    assert (warmed.tokens, warmed.text) == (fresh.tokens, fresh.text)
    assert len(warmed.tokens) > len(reply.tokens or ())  # it went on


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_a_path_ending_in_a_message_to_answer_is_warmed_as_the_prompt_for_its_reply(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """The message and the generation prompt are one chunk (PromptBuilder.marks), so a warm-up
    that stopped at the message's end would hold a state no later path reuses: it prepares
    the reply's prompt, with its logits. Then the reply decodes nothing and equals a cold
    one; a reply edited by hand after that warm-up decodes only its own text."""
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16)
    generator = Generator(runtime, sampling=SAMPLING,
                          checkpoints=CheckpointStore(runtime.identity()))
    tree, reply = _conversation(generator)
    conversation = Conversation(tree)
    user = tree.add_child(reply, Role.USER, "And lakes?")
    path, resume = conversation.warm_target()
    assert path == tree.path_to(user.id) and resume is None
    report = generator.warm(path)
    assert report is not None and report.prompt_tokens == len(generator.prompts.target(path))
    assert generator.warm(path) is None  # nothing left to do
    answer, text, decoded = _reply(generator, tree, user.id, seed=7)
    assert decoded == 0

    # Editing that reply: the warm-up prepares its parent's prompt again, and the edited
    # reply (the generation prompt, then the new text) decodes only after that prompt.
    path, _ = conversation.warm_target(editing=answer)
    assert path == tree.path_to(user.id)
    again = generator.warm(path)  # (a dense cache holds it still: cut back for free)
    assert (again is None) is (kind is MemoryKind.DENSE)
    edited = conversation.edit(answer, "Lakes are still.").nodes[0]
    after = generator.warm(tree.path_to(edited.id))
    assert after is not None
    assert after.reused_tokens == len(generator.prompts.target(path))
    assert after.decoded_tokens == len(edited.tokens or ()) - len(
        generator.prompts.generation_prompt(path))

    cold = Generator(make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=16),
                     sampling=SAMPLING, use_cache=False)
    tree2, reply2 = _conversation(cold)
    user2 = tree2.add_child(reply2, Role.USER, "And lakes?")
    assert text == _reply(cold, tree2, user2.id, seed=7)[1]
