"""Reasoning replies (`<think>...</think>`): splitting, the exports, and the invariant under
a chat template that drops the reasoning of earlier replies (Qwen3's way).

The tiny random models never write `<think>` themselves, so the reasoning replies here are
given by construction: a reply edited to hold reasoning (what an imported reasoning reply
is), or a scripted generation (the model really samples the first token, so the prompt-end
checkpoint is taken as for any reply, and then "says" the scripted text), next to replies the
model generated (which the template also rewrites: Qwen3's wraps the last reply in an empty
think block and drops it in later turns). Every reply is stored as the template renders it in
later turns, so each follow-up reads exactly the template's rendering of the conversation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.core.memory import MemoryKind
from engine.core.prompt import CHATML_TEMPLATE, ChatTemplate, PromptBuilder, Tokenizer
from engine.core.reasoning import (
    OPENED,
    ReasoningState,
    is_opened,
    opens_reasoning,
    split_reasoning,
)
from engine.core.records import from_tree, to_tree
from engine.core.results import FinishReason, NodeView
from engine.core.tree import Node, NodeStatus, Role, Tree
from engine.llm.generator import Generator
from engine.llm.reply import run_reply
from engine.llm.runtime import Generation, Runtime, RuntimeSettings
from engine.service.session import GenerationOptions, Session
from engine.storage.checkpoints import CheckpointStore
from engine.storage.formats.chatgpt_export import export_chatgpt
from engine.storage.formats.chatgpt_import import parse_chatgpt
from engine.storage.formats.markdown import export_markdown
from engine.storage.store import Store
from tests.conftest import ALL_KINDS

# A Qwen3-style template: the last reply after the last user message is rendered with its
# think block (an empty one when it has none); every earlier reply loses its reasoning.
DROPPING = (Path(__file__).parents[2] / "fixtures" / "reasoning_template.jinja").read_text()
REASONED = "<think>\nThe user greets me. I greet back.\n</think>\n\nHello there!"
SAYS_CLOSE = "The tag </think> closes reasoning."
# The ChatML template as DeepSeek-R1's and Qwen3's thinking mode end the generation prompt:
# with the opening marker, so the model writes only the closing one.
OPENING = CHATML_TEMPLATE.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n'")
assert OPENING != CHATML_TEMPLATE

# --- splitting -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reasoning", "answer", "state"),
    [
        ("Plain answer.", "", "Plain answer.", ReasoningState.NONE),
        ("<think>\nA b c.\n</think>\n\nAnswer.", "A b c.", "Answer.", ReasoningState.CLOSED),
        ("  <think>Still going", "Still going", "", ReasoningState.OPEN),
        ("<think>", "", "", ReasoningState.OPEN),
        ("<thinking>x</thinking>y", "x", "y", ReasoningState.CLOSED),
        # A think tag further down is the answer's own text.
        ("Use <think> tags.", "", "Use <think> tags.", ReasoningState.NONE),
        # So is a closing tag, when the reply did not begin inside reasoning.
        (SAYS_CLOSE, "", SAYS_CLOSE, ReasoningState.NONE),
    ],
)
def test_split_reasoning(text: str, reasoning: str, answer: str, state: ReasoningState) -> None:
    split = split_reasoning(text)
    assert (split.reasoning, split.answer, split.state) == (reasoning, answer, state)
    assert split.words == len(reasoning.split())


@pytest.mark.parametrize(
    ("text", "reasoning", "answer", "state"),
    [
        # The template opened the block in the generation prompt: only the end is written.
        ("Weighing it.\n</think>\n\nYes.", "Weighing it.", "Yes.", ReasoningState.CLOSED),
        ("x</think>y", "x", "y", ReasoningState.CLOSED),
        ("x</thinking>y</think>z", "x", "y</think>z", ReasoningState.CLOSED),  # the first end
        ("Still weighing", "Still weighing", "", ReasoningState.OPEN),
        ("", "", "", ReasoningState.OPEN),  # streaming: nothing has come yet
        ("<think>x</think>y", "x", "y", ReasoningState.CLOSED),  # opened again, as written
    ],
)
def test_split_reasoning_of_a_reply_begun_inside_reasoning(
    text: str, reasoning: str, answer: str, state: ReasoningState
) -> None:
    split = split_reasoning(text, opened=True)
    assert (split.reasoning, split.answer, split.state) == (reasoning, answer, state)


@pytest.mark.parametrize(("prompt", "opens"), [
    ("<|im_start|>assistant\n<think>\n", True),
    ("<|im_start|>assistant\n<thinking>  ", True),
    ("<|im_start|>assistant\n", False),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # thinking switched off
])
def test_a_generation_prompt_opens_reasoning_when_it_ends_with_the_marker(
    prompt: str, opens: bool
) -> None:
    assert opens_reasoning(prompt) is opens


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


def test_markdown_writes_a_reply_that_only_mentions_the_closing_tag_whole() -> None:
    tree = Tree()
    tree.add_child(tree.active_leaf, Role.USER, "What does </think> do?")
    tree.add_child(tree.active_leaf, Role.ASSISTANT, SAYS_CLOSE)
    text = export_markdown(from_tree(tree, title="Tags"))
    assert f"## Assistant\n\n{SAYS_CLOSE}\n" in text
    assert "<details>" not in text


def test_markdown_folds_a_reply_whose_prompt_opened_its_reasoning() -> None:
    tree = Tree()
    tree.add_child(tree.active_leaf, Role.USER, "Hi")
    reply = tree.add_child(tree.active_leaf, Role.ASSISTANT, "x</think>y")
    reply.meta[OPENED] = True
    text = export_markdown(from_tree(tree, title="Opened"))
    assert "## Assistant\n\n<details>\n<summary>Reasoning</summary>\n\nx\n\n</details>\n\ny\n" \
        in text


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


def _messages(path: Sequence[Node]) -> list[dict[str, str]]:
    return [{"role": node.role.value, "content": node.text} for node in path]


def _chars(tokens: Sequence[int]) -> str:
    return "".join(map(chr, tokens))


UNCLOSED = "<think>\nCut short, Hello there!"


@pytest.mark.parametrize(("reply", "how"), [
    (REASONED, "generated"),
    (REASONED, "edited"),
    ("<think>\nHmm.\n</think>\n\n<b>Hi</b>", "generated"),  # the answer starts as the block
    ("<think>\nHmm.\n</think>\n\n<b>Hi</b>", "edited"),
    ("Hello there!", "edited"),  # no reasoning: the template still drops the block it gave it
    (UNCLOSED, "edited"),  # reasoning that never ended
])
def test_a_reply_is_stored_as_the_template_renders_it_in_later_turns(
    reply: str, how: str
) -> None:
    """The template drops the reasoning once a user message follows. The reply's tokens are
    that rendering from the start, so the follow-up's prompt is the template's fresh
    rendering of the whole conversation, its prefix is the path as it was before the
    follow-up, and the reply still starts with the generation prompt (its prompt-end
    checkpoint serves the follow-up)."""
    tree = Tree("Be kind.")
    user = tree.add_child(tree.active_leaf, Role.USER, "Hi")
    builder = _char_builder()
    path = tree.path_to(user.id)
    node = tree.add_child(tree.active_leaf, Role.ASSISTANT, reply)
    if how == "generated":
        node.tokens = tuple(builder.reply_tokens(path, [ord(c) for c in reply], reply))
    first = builder.path_tokens(tree.active_path())
    tree.add_child(tree.active_leaf, Role.USER, "Why?")
    target = builder.target(tree.active_path())
    fresh = ChatTemplate(DROPPING).render(_messages(tree.active_path()),
                                          add_generation_prompt=True)
    assert _chars(target) == fresh
    assert target[: len(first)] == first
    assert _chars(node.tokens or ()).startswith(_chars(builder.generation_prompt(path)))
    assert "</think>" not in fresh and _chars(target).count(reply.rsplit("\n", 1)[-1]) == 1


@pytest.mark.parametrize(("template", "reply"), [
    (DROPPING, "Hello there!"),  # rendered alike before and after a later message
    (DROPPING, UNCLOSED),  # the template keeps reasoning that never ended
    (CHATML_TEMPLATE, REASONED),  # a template that keeps every reply as it is
])
def test_a_reply_the_template_keeps_as_it_is_keeps_the_tokens_the_model_wrote(
    template: str, reply: str
) -> None:
    """A guard of what must not change (it passes before the later rendering, too): where
    the later rendering is what the model read, the reply keeps its generated tokens (not
    its text tokenized again, which a real tokenizer may split otherwise; 0x10FFFF stands for
    a token the tokenizer would not give) and stays continuable from them."""
    builder = PromptBuilder(ChatTemplate(template),
                            Tokenizer(tokenize=lambda text: [ord(c) for c in text], bos=None))
    tree = Tree("Be kind.")
    user = tree.add_child(tree.active_leaf, Role.USER, "Hi")
    path = tree.path_to(user.id)
    generated = [0x10FFFF, *map(ord, reply)]
    opening = builder.generation_prompt(path)
    tokens = builder.reply_tokens(path, generated, reply)
    assert tokens == [*opening, *generated, *map(ord, "<|im_end|>\n")]


def _text(runtime: Runtime, tokens: Sequence[int]) -> str:
    """What `tokens` read as (a reply cut short may end inside a character)."""
    return b"".join(runtime.model.token_bytes(t, special=True) for t in tokens).decode(
        errors="replace")


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


class Scripted:
    """The next replies of a runtime's model, scripted: each really generates its first
    tokens (so the prompt-end checkpoint is taken, and the context moves past the prompt, as
    for any reply) and then "says" the next text given, as the tokens the model's tokenizer
    gives it."""

    def __init__(self, runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
        self.texts: list[str] = []
        real = runtime.generate

        def generate(**kwargs: Any) -> Generation:
            if not self.texts:
                return real(**kwargs)
            text = self.texts.pop(0)
            first = real(**{**kwargs, "max_tokens": 3})
            return replace(first, tokens=tuple(runtime.model.tokenize(text)), text=text,
                           finish=FinishReason.LENGTH)

        monkeypatch.setattr(runtime, "generate", generate)


def _fresh(runtime: Runtime, path: Sequence[Node], *, add_generation_prompt: bool) -> list[int]:
    """The template's rendering of the whole conversation from scratch, tokenized: what a
    full reprocess that re-renders history would read."""
    model = runtime.model
    text = ChatTemplate(DROPPING, bos_text=model.bos_text, eos_text=model.eos_text).render(
        _messages(path), add_generation_prompt=add_generation_prompt)
    return ([] if model.bos is None else [model.bos]) + model.tokenize(text)


def _prompt_of(session: Session, runtime: Runtime) -> list[int]:
    """The prompt the active path's last reply was generated from, as its generator builds
    it; it must read as the template's fresh rendering (as text: a generated reply keeps the
    tokens the model wrote, which its text tokenized again may split otherwise)."""
    path = session.tree.active_path()[:-1]
    assert session.generator is not None
    prompt = session.generator.prompts.target(path)
    fresh = _fresh(runtime, path, add_generation_prompt=True)
    assert _text(runtime, prompt) == _text(runtime, fresh)
    return prompt


def test_replies_after_reasoning_equal_a_full_reprocess_under_a_dropping_template(
    dropping_runtimes: tuple[Runtime, Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every follow-up after a reasoning reply (generated, continued, edited) reads the
    template's fresh rendering of the conversation, and the cached session (warmed between
    steps, as the app does) answers exactly as the full reprocess does."""
    cached_rt, reference_rt = dropping_runtimes
    scripts = [Scripted(runtime, monkeypatch) for runtime in dropping_runtimes]
    cached = Session(cached_rt, system="Be kind.", seed=5,
                     checkpoints=CheckpointStore(cached_rt.identity()))
    reference = Session(reference_rt, system="Be kind.", seed=5, use_cache=False)
    assert cached.generator is not None and cached.generator.template.is_model_own
    options = GenerationOptions(max_tokens=8)

    def both(step: str, *, said: str | None = None) -> None:
        for script in scripts:
            script.texts = [said] if said is not None else []
        mine, theirs = (_step(session, step, options) for session in (cached, reference))
        assert mine == theirs, f"{step}: the cached reply differs from the full reprocess"
        assert [n.tokens for n in cached.tree.active_path()] == [
            n.tokens for n in reference.tree.active_path()]
        if step.startswith(("send", "regenerate")):
            assert _prompt_of(cached, cached_rt) == _prompt_of(reference, reference_rt)
        cached.warm(options)

    both("send:Hi", said=REASONED)  # a generated reasoning reply
    both("send:Why?")  # its reasoning is dropped by the template from here on
    both("send:Go on", said="<think>\nThe user wants more.")  # stopped while reasoning
    both("continue", said="\n</think>\n\nHello there!")  # ... and finished
    for session in (cached, reference):  # no stale `open_len` of the run that stopped
        assert session.tree.messages()[-1].meta["open_len"] is None
    both("continue")  # a reply stored as rendered later goes on from its text
    both("send:And?")
    both("edit-reply:" + REASONED)  # a reasoning reply (as imported or edited)
    both("send:Then?")  # its reasoning is dropped too
    both("regenerate")
    both("send:And then?")
    for session, runtime in ((cached, cached_rt), (reference, reference_rt)):
        path = session.tree.active_path()
        text = "".join(_text(runtime, n.tokens or ()) for n in path)
        assert text.count("Hello there!") == 3  # each reply once, no turn another's text
        assert "</think>" not in text  # every reply as the template renders it later
        for user in (n for n in path if n.role is Role.USER):  # after generated replies too
            own = f"<|im_start|>user\n{user.text}<|im_end|>\n"
            assert _text(runtime, user.tokens or ()) == own


def test_a_path_after_reasoning_replies_is_the_templates_fresh_rendering(
    dropping_runtimes: tuple[Runtime, Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored tokens of a whole path (reasoning replies generated and edited, plain
    ones in between) are the template's rendering of the conversation from scratch, with the
    model's real tokenizer."""
    runtime = dropping_runtimes[0]
    script = Scripted(runtime, monkeypatch)
    session = Session(runtime, system="Be kind.", seed=5)
    options = GenerationOptions(max_tokens=6)
    script.texts = [REASONED, "Because I like you.", "<think>\nBye.\n</think>\n\nBye!"]
    session.send("Hi", options)
    session.send("Why?", options)
    session.edit(session.tree.messages()[-1].id, "<think>\nShort.\n</think>\n\nBecause.")
    session.send("Bye", options)
    path = session.tree.active_path()
    assert session.generator is not None
    stored = session.generator.prompts.path_tokens(path)
    # The last reply as a later turn renders it: with a message after it.
    more = Node(id=-1, parent=None, role=Role.USER, text="More", created=0.0)
    fresh = _fresh(runtime, [*path, more], add_generation_prompt=False)
    assert stored + runtime.model.tokenize("<|im_start|>user\nMore<|im_end|>\n") == fresh


def test_a_follow_up_after_a_reasoning_reply_reuses_its_prompt_end(
    dropping_runtimes: tuple[Runtime, Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply's tokens start with the generation prompt it was generated from, so the
    follow-up (which reads the reply without its reasoning) reuses the context up to there:
    the live prefix or, for a model that cannot cut its state back, the checkpoint taken at
    the prompt's end."""
    runtime = dropping_runtimes[0]
    script = Scripted(runtime, monkeypatch)
    session = Session(runtime, system="Be kind.", seed=5,
                      checkpoints=CheckpointStore(runtime.identity()))
    options = GenerationOptions(max_tokens=6)
    script.texts = [REASONED]
    session.send("Hi", options)
    step = session.send("Why?", options)
    prompt = _prompt_of(session, runtime)
    path = session.tree.active_path()
    reply = path[2]
    prompt_len = reply.meta["prompt_len"]
    assert isinstance(prompt_len, int) and reply.meta["open_len"] is None
    reply_start = sum(len(node.tokens or ()) for node in path[:2])
    assert step.report is not None and step.report.prompt_tokens == len(prompt)
    assert step.report.reused_tokens >= reply_start + prompt_len, step.report.describe()


def _step(session: Session, step: str, options: GenerationOptions) -> str | None:
    op, _, text = step.partition(":")
    if op == "send":
        return session.send(text, options).text
    if op == "regenerate":
        return session.regenerate(options).text
    reply = session.tree.messages()[-1]
    assert reply.role is Role.ASSISTANT
    if op == "continue":
        return session.resume(reply.id, options).text
    return session.edit(reply.id, text, options).text


# --- a reply whose generation prompt opened its reasoning ----------------------------------


@pytest.fixture
def opening_runtime(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Runtime]:
    """A runtime whose model's own chat template ends the generation prompt with `<think>`."""
    runtime = Runtime(tiny_models[ALL_KINDS[0].value], RuntimeSettings(n_ctx=512, n_batch=16))
    monkeypatch.setattr(runtime.model, "chat_template", lambda: OPENING)
    yield runtime
    runtime.close()


def test_a_reply_after_a_prompt_that_opened_reasoning_keeps_the_flag_through_a_store(
    opening_runtime: Runtime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The engine marks the reply (its prompt ended with `<think>`), so its `x</think>y`
    folds; a reply of the plain template does not get the mark. The mark is saved and read
    back with the conversation."""
    script = Scripted(opening_runtime, monkeypatch)
    session = Session(opening_runtime, system="Be kind.", seed=5)
    assert session.generator is not None and session.generator.template.is_model_own
    options = GenerationOptions(max_tokens=4)
    script.texts = ["x</think>y"]
    session.send("Hi", options)
    reply = session.tree.messages()[-1]
    assert reply.meta[OPENED] is True
    split = split_reasoning(reply.text, is_opened(reply.meta))
    assert (split.reasoning, split.answer, split.state) == ("x", "y", ReasoningState.CLOSED)
    with Store(tmp_path / "c.db") as store:
        cid = store.create(session.tree, title="Opened")
    with Store(tmp_path / "c.db") as store:
        loaded = store.load(cid)
    assert is_opened(loaded.messages()[-1].meta)
    edited = session.conversation.edit(reply.id, "z</think>w").nodes[0]  # the same prompt
    assert is_opened(edited.meta)

    monkeypatch.setattr(opening_runtime.model, "chat_template", lambda: CHATML_TEMPLATE)
    plain = Session(opening_runtime, system="Be kind.", seed=5)
    script.texts = [SAYS_CLOSE]
    plain.send("Hi", options)
    reply = plain.tree.messages()[-1]
    assert reply.meta[OPENED] is False
    assert split_reasoning(reply.text, is_opened(reply.meta)).state is ReasoningState.NONE


def test_a_stored_reply_without_the_flag_reads_as_not_opened() -> None:
    """Stores written before the flag existed: a reply's meta has no `OPENED`."""
    assert not is_opened({"open_len": 3, "prompt_len": 2})
    assert not is_opened({OPENED: "yes"})


def test_the_engine_says_before_the_first_piece_that_the_reply_began_inside_reasoning(
    opening_runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So the window shows the streaming text as reasoning from the start; a plain
    template's reply is not announced so."""
    session = Session(opening_runtime, system="Be kind.", seed=5)
    session.conversation.send("Hi")
    path = session.tree.active_path()
    said: list[str] = []
    for template, expected in ((OPENING, ["opened", "piece"]), (CHATML_TEMPLATE, ["piece"])):
        monkeypatch.setattr(opening_runtime.model, "chat_template", lambda t=template: t)
        generator = Generator(opening_runtime)
        said.clear()
        result = run_reply(generator, [NodeView.of(n).to_node() for n in path], max_tokens=2,
                           seed=1, on_piece=lambda _piece: said.append("piece"),
                           on_opened=lambda: said.append("opened"))
        assert said[: len(expected)] == expected
        assert dict(result.meta)[OPENED] is (template == OPENING)
