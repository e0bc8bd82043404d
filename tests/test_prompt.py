"""Prompts: each node keeps the tokens it was first rendered to."""

from __future__ import annotations

from pathlib import Path

from engine.llama import LlamaModel
from engine.prompt import CHATML_TEMPLATE, ChatTemplate, PromptBuilder, Tokenizer
from engine.tree import Role, Tree


def _char_tokenizer(bos: int | None = None) -> Tokenizer:
    return Tokenizer(tokenize=lambda text: [ord(c) for c in text], bos=bos)


def _text(tokens: list[int] | tuple[int, ...]) -> str:
    return "".join(chr(t) for t in tokens)


def _builder(source: str = CHATML_TEMPLATE, bos: int | None = None) -> PromptBuilder:
    return PromptBuilder(ChatTemplate(source, bos_text="<s>"), _char_tokenizer(bos))


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
        template = model.chat_template()
        assert template is not None
        builder = PromptBuilder(
            ChatTemplate(template, bos_text=model.bos_text, eos_text=model.eos_text),
            Tokenizer(tokenize=model.tokenize, bos=model.bos),
        )
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
