"""Reasoning replies (`<think>...</think>`): splitting, the exports, and the invariant under
a chat template that drops the reasoning of earlier replies (Qwen3's way).

The tiny random models never write `<think>` themselves, so the reasoning replies here are
given by construction: a reply edited to hold reasoning (what an imported reasoning reply
is), next to replies the model generated (which the template also rewrites: Qwen3's wraps
the last reply in an empty think block and drops it in later turns).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.formats.chatgpt import export_chatgpt, parse_chatgpt
from engine.formats.markdown import export_markdown
from engine.model import MemoryKind
from engine.prompt import ChatTemplate, PromptBuilder, Tokenizer
from engine.reasoning import ReasoningState, split_reasoning
from engine.records import from_tree, to_tree
from engine.runtime import Runtime, RuntimeSettings
from engine.session import GenerationOptions, Session
from engine.tree import NodeStatus, Role, Tree
from tests.conftest import ALL_KINDS

# A Qwen3-style template: the last reply after the last user message is rendered with its
# think block (an empty one when it has none); every earlier reply loses its reasoning.
DROPPING = (Path(__file__).parent / "fixtures" / "reasoning_template.jinja").read_text()
REASONED = "<think>\nThe user greets me. I greet back.\n</think>\n\nHello there!"

# --- splitting -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reasoning", "answer", "state"),
    [
        ("Plain answer.", "", "Plain answer.", ReasoningState.NONE),
        ("<think>\nA b c.\n</think>\n\nAnswer.", "A b c.", "Answer.", ReasoningState.CLOSED),
        ("  <think>Still going", "Still going", "", ReasoningState.OPEN),
        ("<think>", "", "", ReasoningState.OPEN),
        ("<thinking>x</thinking>y", "x", "y", ReasoningState.CLOSED),
        # The template opened the block in the generation prompt: only the end is written.
        ("Weighing it.\n</think>\n\nYes.", "Weighing it.", "Yes.", ReasoningState.CLOSED),
        # A think tag further down is the answer's own text.
        ("Use <think> tags.", "", "Use <think> tags.", ReasoningState.NONE),
    ],
)
def test_split_reasoning(text: str, reasoning: str, answer: str, state: ReasoningState) -> None:
    split = split_reasoning(text)
    assert (split.reasoning, split.answer, split.state) == (reasoning, answer, state)
    assert split.words == len(reasoning.split())


# --- exports -------------------------------------------------------------------------------


def _reasoning_tree(status: NodeStatus = NodeStatus.COMPLETE) -> Tree:
    tree = Tree("Be kind.")
    tree.add_child(tree.active_leaf, Role.USER, "Hi")
    reply = tree.add_child(tree.active_leaf, Role.ASSISTANT, REASONED)
    reply.status = status
    return tree


def test_markdown_writes_the_reasoning_as_a_details_block_above_the_answer() -> None:
    text = export_markdown(from_tree(_reasoning_tree(), title="Greeting"))
    assert (
        "## Assistant\n\n<details>\n<summary>Reasoning</summary>\n\n"
        "The user greets me. I greet back.\n\n</details>\n\nHello there!\n"
    ) in text
    assert "<think>" not in text


def test_markdown_marks_reasoning_that_never_ended() -> None:
    tree = Tree()
    tree.add_child(tree.active_leaf, Role.USER, "Hi")
    tree.add_child(tree.active_leaf, Role.ASSISTANT, "<think>\nHmm, let me",
                   status=NodeStatus.INTERRUPTED)
    text = export_markdown(from_tree(tree, title="Cut"))
    assert "<summary>Reasoning (unfinished)</summary>\n\nHmm, let me\n\n</details>" in text


def test_chatgpt_export_keeps_the_reasoning_and_imports_it_back() -> None:
    record = from_tree(_reasoning_tree(), title="Greeting")
    data = export_chatgpt([record])
    parts = [entry["message"]["content"]["parts"]
             for entry in json.loads(data)[0]["mapping"].values() if entry["message"]]
    assert [REASONED] in parts
    (back,) = parse_chatgpt(data)
    tree = to_tree(back)
    assert tree.messages()[1].text == REASONED
    assert split_reasoning(tree.messages()[1].text).answer == "Hello there!"


# --- the invariant under a template that drops earlier reasoning ---------------------------


def _char_builder() -> PromptBuilder:
    return PromptBuilder(ChatTemplate(DROPPING),
                         Tokenizer(tokenize=lambda text: [ord(c) for c in text], bos=None))


@pytest.mark.parametrize("reply", [
    REASONED,
    "<think>\nHmm.\n</think>\n\n<b>Hi</b>",  # the answer starts as the think block does
    "Hello there!",  # no reasoning: the template still drops the empty block it gave it
    "<think>\nCut short, Hello there!",  # reasoning that never ended
])
def test_a_follow_up_after_reasoning_holds_the_reply_as_read_and_its_own_turn_once(
    reply: str,
) -> None:
    """The template drops the reasoning once a user message follows; the reply keeps the
    tokens it had (what the model read and wrote), and the follow-up's tokens are its own
    turn: not the answer again (the template's rewritten tail of the reply)."""
    tree = Tree("Be kind.")
    tree.add_child(tree.active_leaf, Role.USER, "Hi")
    tree.add_child(tree.active_leaf, Role.ASSISTANT, reply)
    builder = _char_builder()
    first = "".join(map(chr, builder.path_tokens(tree.active_path())))
    tree.add_child(tree.active_leaf, Role.USER, "Why?")
    target = "".join(map(chr, builder.target(tree.active_path())))
    assert target == first + "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"
    assert target.count(reply.rsplit("\n", 1)[-1]) == 1  # the answer is read once


def _text(runtime: Runtime, tokens: tuple[int, ...]) -> str:
    return b"".join(runtime.model.token_bytes(t, special=True) for t in tokens).decode()


@pytest.fixture(params=ALL_KINDS, ids=lambda kind: kind.value)
def dropping_runtimes(
    request: pytest.FixtureRequest, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Runtime, Runtime]]:
    """A runtime for the cached session and one for the full reprocess, whose model's own
    chat template is the reasoning-dropping one."""
    kind: MemoryKind = request.param
    settings = RuntimeSettings(n_ctx=1024, n_batch=16)
    pair = (Runtime(tiny_models[kind.value], settings),
            Runtime(tiny_models[kind.value], settings))
    for runtime in pair:
        monkeypatch.setattr(runtime.model, "chat_template", lambda: DROPPING)
    yield pair
    for runtime in pair:
        runtime.close()


def test_replies_after_reasoning_equal_a_full_reprocess_under_a_dropping_template(
    dropping_runtimes: tuple[Runtime, Runtime],
) -> None:
    cached_rt, reference_rt = dropping_runtimes
    cached = Session(cached_rt, system="Be kind.", seed=5)
    reference = Session(reference_rt, system="Be kind.", seed=5, use_cache=False)
    assert cached.generator is not None and cached.generator.template.is_model_own
    options = GenerationOptions(max_tokens=8)

    def both(step: str) -> None:
        mine, theirs = (_step(session, step, options) for session in (cached, reference))
        assert mine == theirs, f"{step}: the cached reply differs from the full reprocess"

    both("send:Hi")  # a generated reply: the template gives it an empty think block
    both("send:Go on")  # ... and drops it now
    both("edit-reply:" + REASONED)  # a reasoning reply (as imported or edited)
    both("send:Why?")  # its reasoning is dropped by the template from here on
    both("regenerate")
    both("send:And then?")
    for session, runtime in ((cached, cached_rt), (reference, reference_rt)):
        path = session.tree.active_path()
        text = "".join(_text(runtime, n.tokens or ()) for n in path)
        assert text.count("Hello there!") == 1  # no turn holds another's text
        assert text.count("<think>\nThe user greets me.") == 1  # the reply as the model read it
        for user in (n for n in path if n.role is Role.USER):  # after generated replies too
            own = f"<|im_start|>user\n{user.text}<|im_end|>\n"
            assert _text(runtime, user.tokens or ()) == own
    assert [n.tokens for n in cached.tree.active_path()] == [
        n.tokens for n in reference.tree.active_path()
    ]


def _step(session: Session, step: str, options: GenerationOptions) -> str | None:
    op, _, text = step.partition(":")
    if op == "send":
        return session.send(text, options).text
    if op == "regenerate":
        return session.regenerate(options).text
    reply = session.tree.messages()[-1]
    assert reply.role is Role.ASSISTANT
    return session.edit(reply.id, text, options).text
