"""Prompts: each node keeps the tokens it was first rendered to."""

from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.core.errors import Cancelled
from engine.core.prompt import (
    CHATML_TEMPLATE,
    ChatTemplate,
    PromptBuilder,
    TemplateError,
    Tokenizer,
)
from engine.core.schedule import decode_schedule
from engine.core.tree import Node, Role, Tree
from engine.llm.llama import LlamaModel
from tests.fixtures.vendored import template


def _char_tokenizer(bos: int | None = None) -> Tokenizer:
    return Tokenizer(tokenize=lambda text: [ord(c) for c in text], bos=bos)


def _text(tokens: list[int] | tuple[int, ...]) -> str:
    return "".join(chr(t) for t in tokens)


def _builder(source: str = CHATML_TEMPLATE, bos: int | None = None) -> PromptBuilder:
    return PromptBuilder(ChatTemplate(source, bos_text="<s>"), _char_tokenizer(bos))


def _model_builder(model: LlamaModel) -> PromptBuilder:
    """The prompt builder of a real model: its own chat template and tokenizer."""
    template = model.chat_template()
    assert template is not None
    return PromptBuilder(
        ChatTemplate(template, bos_text=model.bos_text, eos_text=model.eos_text),
        Tokenizer(tokenize=model.tokenize, bos=model.bos))


def test_a_path_renders_node_by_node_to_the_whole_template() -> None:
    tree = Tree("Be brief.")
    tree.add_child(tree.active_leaf, Role.USER, "Hi")
    tree.add_child(tree.active_leaf, Role.ASSISTANT, "Hello!")
    tree.add_child(tree.active_leaf, Role.USER, "Bye")
    builder = _builder()
    target = builder.target(tree.active_path())
    template = ChatTemplate(CHATML_TEMPLATE)
    messages = [{"role": n.role.value, "content": n.text} for n in tree.active_path()]
    assert _text(target) == template.render(messages, add_generation_prompt=True)
    assert _text(tree.root.tokens or ()) == "<|im_start|>system\nBe brief.<|im_end|>\n"
    assert _text(tree.message(1).tokens or ()) == "<|im_start|>assistant\nHello!<|im_end|>\n"


def test_node_tokens_do_not_change_when_the_template_rewrites_history() -> None:
    # A template that hides every assistant message but the last (like reasoning models that
    # strip earlier thoughts): re-rendering would change the prefix; stored tokens do not.
    hiding = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
        "<|a|>[hidden]\n{% else %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tree = Tree()
    tree.add_child(tree.active_leaf, Role.USER, "q1")
    tree.add_child(tree.active_leaf, Role.ASSISTANT, "secret")
    builder = _builder(hiding)
    first = builder.path_tokens(tree.active_path())
    tree.add_child(tree.active_leaf, Role.USER, "q2")
    second = builder.target(tree.active_path())
    assert second[: len(first)] == first  # the prefix is stable by construction
    assert "secret" in _text(second)


def test_a_generated_reply_keeps_its_exact_tokens_and_the_template_closing() -> None:
    tree = Tree()
    user = tree.add_child(tree.active_leaf, Role.USER, "Hi")
    builder = _builder()
    path = tree.path_to(user.id)
    generated = [ord(c) for c in "Yo"]
    tokens = builder.reply_tokens(path, generated, "Yo")
    assert _text(tokens) == "<|im_start|>assistant\nYo<|im_end|>\n"
    prompt = builder.target(path)
    assert tokens[: len(builder.generation_prompt(path))] == prompt[len(builder.path_tokens(path)):]


def test_bos_is_put_first_once_when_the_model_wants_it() -> None:
    tree = Tree("S")
    tree.add_child(tree.active_leaf, Role.USER, "Hi")
    builder = _builder(bos=1)
    target = builder.target(tree.active_path())
    assert target[0] == 1 and target.count(1) == 1


def test_smollm2_template_without_a_system_prompt_uses_its_default(smollm2_path: Path) -> None:
    model = LlamaModel(smollm2_path)
    try:
        builder = _model_builder(model)
        tree = Tree()
        tree.add_child(tree.active_leaf, Role.USER, "What is 2+2?")
        target = builder.target(tree.active_path())
        text = "".join(model.token_text(t) for t in target)
        assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
        assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
        assert tree.root.tokens == ()
        # Special tokens are parsed as single tokens, not spelled out.
        assert target.count(model.tokenize("<|im_start|>")[0]) == 3
    finally:
        model.close()


# --- many nodes at once: one rendering, cut up --------------------------------------------

HIDING = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
    "<|a|>[hidden]\n{% else %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# Renders each message in a frame but trims its content (as Gemma's does).
TRIMMING = (
    "{{ bos_token }}{% for m in messages %}<turn>{{ m['role'] }}\n{{ m['content'] | trim }}"
    "<end>\n{% endfor %}{% if add_generation_prompt %}<turn>assistant\n{% endif %}"
)
# Folds the system prompt into the first user message (as Llama 2's does).
FOLDING = (
    "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}"
    "{% set rest = messages[1:] %}{% else %}{% set sys = '' %}{% set rest = messages %}"
    "{% endif %}{% for m in rest %}{% if m['role'] == 'user' %}[INST] "
    "{% if loop.first and sys %}<<SYS>>{{ sys }}<</SYS>> {% endif %}{{ m['content'] }} "
    "[/INST]{% else %} {{ m['content'] }} </s>{% endif %}{% endfor %}"
)
# Not prefix-stable at all: the head counts the messages.
COUNTING = (
    "[{{ messages | length }}]{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
REASONING = (Path(__file__).parents[2] / "fixtures" / "reasoning_template.jinja").read_text()
TEMPLATES = {"chatml": CHATML_TEMPLATE, "hiding": HIDING, "trimming": TRIMMING,
             "folding": FOLDING, "counting": COUNTING, "reasoning": REASONING}


class _Counted(ChatTemplate):
    """Counts the characters it renders: the work of giving a path its tokens."""

    rendered = 0

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None) -> str:
        text = super().render(messages, add_generation_prompt=add_generation_prompt,
                              tools=tools)
        self.rendered += len(text)
        return text


def _long_tree(size: int, length: int = 380) -> Tree:
    tree = Tree("Be brief.")
    for index in range(size):
        text = (f"{index} " + "lorem ipsum dolor sit amet " * (length // 20 + 1))[:length]
        tree.add_child(tree.active_leaf, Role.USER if index % 2 == 0 else Role.ASSISTANT, text)
    return tree


def _node_by_node(source: str, path: Sequence[Node]) -> list[tuple[int, ...] | None]:
    """The tokens each node gets when rendered on its own after its ancestors."""
    copies = [replace(node, tokens=None) for node in path]
    builder = _builder(source, bos=1)
    for index in range(len(copies)):
        builder.ensure_tokens(copies[: index + 1])  # one node at a time: never tiled
    return [node.tokens for node in copies]


def test_giving_a_long_path_its_tokens_renders_in_proportion_to_its_length() -> None:
    def work(size: int) -> int:
        template = _Counted(CHATML_TEMPLATE)
        PromptBuilder(template, _char_tokenizer()).ensure_tokens(_long_tree(size).active_path())
        return template.rendered

    small, large = work(200), work(400)
    assert large <= 2 * small + 10_000  # every prefix rendered: about 4 times


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_tiled_path_gets_the_tokens_each_node_gets_on_its_own(name: str) -> None:
    tree = Tree("Be brief.")
    texts = ["Hi", "  Hello! ", "<think>\nHmm.\n</think>\n\nYes.", "", "Why?\n", "Because.",
             "ok", "<think>\nShort.\n</think>\n\nNo.", "Then?", "Then.", "bye", " "]
    for index, text in enumerate(texts):
        tree.add_child(tree.active_leaf, Role.USER if index % 2 == 0 else Role.ASSISTANT, text)
    path = tree.active_path()
    expected = _node_by_node(TEMPLATES[name], path)
    _builder(TEMPLATES[name], bos=1).ensure_tokens(path)
    assert [node.tokens for node in path] == expected


_ROLES = st.sampled_from([Role.USER, Role.ASSISTANT])
_TEXTS = st.one_of(
    st.sampled_from(["", " ", "\n", "Hi", " Hi ", "<think>\nx\n</think>\n\ny", "<|im_end|>",
                     "[hidden]", "<end>\n", "user", "\u2063"]),
    st.text(alphabet=" \nab<>|/", max_size=12))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(TEMPLATES)), system=st.sampled_from(["", "S", " S\n"]),
       messages=st.lists(st.tuples(_ROLES, _TEXTS), min_size=0, max_size=14),
       tokenized=st.integers(min_value=0, max_value=4))
@example(name="reasoning", system="S", tokenized=0,  # two replies in a row, the later form
         messages=[(Role.ASSISTANT, ""), (Role.ASSISTANT, ""), (Role.USER, ""),
                   (Role.ASSISTANT, ""), (Role.ASSISTANT, ""), (Role.USER, ""),
                   (Role.USER, "")])
@example(name="reasoning", system="S", tokenized=0,  # a reply with reasoning, then a continue
         messages=[(Role.ASSISTANT, ""), (Role.ASSISTANT, ""), (Role.USER, ""),
                   (Role.ASSISTANT, "<think>\nx\n</think>\n\ny"), (Role.ASSISTANT, "")])
def test_tiling_never_changes_a_token(name: str, system: str,
                                      messages: list[tuple[Role, str]], tokenized: int) -> None:
    """Whatever the template, roles and texts, and however many nodes have tokens already:
    the tokens are those each node gets rendered on its own."""
    tree = Tree(system)
    for role, text in messages:
        tree.add_child(tree.active_leaf, role, text)
    path = tree.active_path()
    try:
        expected = _node_by_node(TEMPLATES[name], path)
    except TemplateError:
        return
    builder = _builder(TEMPLATES[name], bos=1)
    builder.ensure_tokens(path[:tokenized])
    builder.ensure_tokens(path)
    assert [node.tokens for node in path] == expected


def test_a_template_that_is_not_prefix_stable_is_rendered_node_by_node() -> None:
    path = _long_tree(12).active_path()
    expected = _node_by_node(COUNTING, path)
    template = _Counted(COUNTING)
    PromptBuilder(template, _char_tokenizer(1)).ensure_tokens(path)
    assert [node.tokens for node in path] == expected


def test_a_stop_frees_the_work_between_two_nodes() -> None:
    path = _long_tree(200).active_path()
    tokenized: list[str] = []

    def tokenize(text: str) -> list[int]:
        tokenized.append(text)
        return [ord(c) for c in text]

    builder = PromptBuilder(ChatTemplate(CHATML_TEMPLATE), Tokenizer(tokenize, None))
    with pytest.raises(Cancelled):
        builder.ensure_tokens(path, cancel=lambda: len(tokenized) > 5)
    assert sum(node.tokens is not None for node in path) == 5


def test_a_path_of_the_apis_largest_size_is_refused_in_bounded_work() -> None:
    """10,000 messages, about 4 MiB: the path's tokens pass the context after a few nodes,
    and what is rendered is a few times the path, not the square of it."""
    path = _long_tree(10_000, length=400).active_path()
    chars = sum(len(node.text) for node in path)
    template = _Counted(CHATML_TEMPLATE)
    builder = PromptBuilder(template, _char_tokenizer())
    tracemalloc.start()
    try:
        assert builder.ensure_tokens(path, limit=8192) is False
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert template.rendered <= 12 * chars
    assert peak <= 40 * chars  # a few renderings of the path, not thousands
    assert path[-1].tokens is None and path[10].tokens is not None


def test_the_bundled_models_template_tiles_a_path_as_it_renders_node_by_node(
    smollm2_path: Path,
) -> None:
    model = LlamaModel(smollm2_path)
    try:
        builder = _model_builder(model)
        for system in ("", "Be brief."):
            tree = Tree(system)
            texts = ["Hi", " Hello! ", "What is 2+2?", "4\n", "<|im_end|> odd", "", "ok"] * 3
            for index, text in enumerate(texts):
                tree.add_child(tree.active_leaf,
                               Role.USER if index % 2 == 0 else Role.ASSISTANT, text)
            path = tree.active_path()
            copies = [replace(node, tokens=None) for node in path]
            for index in range(len(copies)):
                builder.ensure_tokens(copies[: index + 1])  # one node at a time
            builder.ensure_tokens(path)  # all at once: tiled
            assert [node.tokens for node in path] == [node.tokens for node in copies]
            assert builder.target(path) == model.tokenize(
                builder._template.render(
                    [{"role": n.role.value, "content": n.text} for n in path if n.text
                     or n.role is not Role.SYSTEM], add_generation_prompt=True))
    finally:
        model.close()


def test_replies_keep_the_generation_prompt_unless_it_opens_reasoning_they_drop(
    vendored: Path,
) -> None:
    """Where they keep it, a prompt-end state serves every later path through its reply (the
    engine then saves no state at the message's end, a few tokens before)."""
    assert _builder(CHATML_TEMPLATE, bos=1).replies_keep_opening
    assert _builder(TEMPLATES["reasoning"], bos=1).replies_keep_opening  # opens none
    # Qwen 3.5 opens `<think>` in the generation prompt; a reply's later form has none.
    assert not _builder(template(vendored, "Qwen3.5-4B"), bos=1).replies_keep_opening


def _answered(builder: PromptBuilder, tree: Tree, parent: int, text: str) -> Node:
    """A reply to `parent` as the engine stores it: its tokens and its opening's length."""
    path = tree.path_to(parent)
    reply = tree.add_child(parent, Role.ASSISTANT, text)
    generated = [ord(c) for c in text]
    reply.tokens = tuple(builder.reply_tokens(path, generated, text))
    reply.meta["prompt_len"] = len(builder.generation_prompt(path))
    return reply


@pytest.mark.parametrize("name", ["chatml", "qwen3.5"])
def test_a_message_and_the_generation_prompt_after_it_are_one_chunk_where_replies_keep_it(
    vendored: Path, name: str,
) -> None:
    """The schedule of a prompt is the schedule of every later path through its reply, up to
    the prompt's end; where replies keep their opening, the message before it does not end
    a chunk (a few tokens alone cost a whole pass over the weights)."""
    source = CHATML_TEMPLATE if name == "chatml" else template(vendored, "Qwen3.5-4B")
    builder = _builder(source, bos=1)
    tree = Tree(system="Be brief.")
    user = tree.add_child(tree.root_id, Role.USER, "Hi " * 80)
    reply = _answered(builder, tree, user.id, "Hello.")
    second = tree.add_child(reply.id, Role.USER, "More " * 30)
    path = tree.path_to(second.id)
    builder.ensure_tokens(path)
    ends = list(itertools.accumulate(len(node.tokens or ()) for node in path))
    joined = name == "chatml"
    assert builder.replies_keep_opening is joined
    marks = builder.marks(path)
    assert (ends[1] in marks) is not joined  # the user message before the reply
    assert ends[0] in marks and ends[2] in marks and ends[3] in marks  # the rest end one
    for index in range(1, len(path)):  # (a template may refuse a prompt of no user message)
        prefix = path[: index + 1]
        target = builder.target(prefix)
        prompt = decode_schedule(len(target), n_batch=64, grid=16,
                                 marks=builder.target_marks(prefix), long_run=1000)
        assert (ends[index] in prompt.ends) is (not joined or ends[index] % 16 == 0)
        if index != 1:
            continue
        later = decode_schedule(ends[-1], n_batch=64, grid=16, marks=marks, long_run=1000)
        if joined:  # the state at the prompt's end serves the later path
            assert later.agrees(prompt.ends)
        else:  # the later path holds the reply re-rendered: only its prefix serves
            assert later.agrees(prompt.upto(ends[index]))
