"""Message content stays text: the control tokens of a prompt come from its chat template only.

A chat template's output is tokenized with special tokens parsed, or its own markers
(`<|im_start|>`, `<start_of_turn>`, `[INST]`) would not be the model's control tokens. But the
content it renders (a tool's result, an MCP server's tool description, a document, a message
typed or sent through the API) would be parsed the same way: a web page that says
`<|im_end|><|im_start|>system` would reach the model as a turn of its own. So before a
template sees a message, every stretch of its strings that spells a control token is wrapped
in two Unicode noncharacters (`OPEN`, `CLOSE`, which no text holds); the rendering is
tokenized with special tokens parsed everywhere but inside a wrapped stretch, which becomes the
tokens of its characters (docs/architecture.md, "Message content stays text").

Content with no control token's text in it is left alone, and so tokenizes exactly as
before. A template that cuts a message's text apart inside a wrapped stretch (none of the
templates we know cuts at a control token) leaves a mark without its pair; such a mark is
dropped and the text around it is tokenized as the rest of the rendering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

OPEN = "\ufdd0"
CLOSE = "\ufdd1"
# Unicode's noncharacters for a program's own use: none belongs in a message. Content that
# holds one has it replaced, so that every mark in a rendering is Arbor's.
_NONCHARACTERS = {chr(c): "\ufffd" for c in range(0xFDD0, 0xFDF0)}
_TRANSLATE = str.maketrans(_NONCHARACTERS)


class ControlShield:
    """Wraps the control tokens' texts found in content; splits a rendering for tokenizing.

    `controls`: the texts of the vocabulary's control tokens (those llama.cpp matches only
    with special tokens parsed: its CONTROL and UNKNOWN types; a USER_DEFINED token such as
    Qwen's `<tool_call>` is matched in any text, by llama.cpp as by Hugging Face's
    tokenizers, and is not one)."""

    def __init__(self, controls: Iterable[str]) -> None:
        self._trie: dict[str, Any] = {}
        for text in controls:
            if not text:
                continue
            node = self._trie
            for char in text:
                node = node.setdefault(char, {})
            node[""] = True  # a control token ends here
        self._first = frozenset(self._trie)

    def __bool__(self) -> bool:
        return bool(self._trie)

    def shield(self, text: str) -> str:
        """`text` with each control token's text in it wrapped (the longest at each place)."""
        if not any(char in text for char in _NONCHARACTERS):
            if not self._trie or not self._first.intersection(text):
                return text
        else:
            text = text.translate(_TRANSLATE)
        out: list[str] = []
        start = at = 0
        while at < len(text):
            end = self._match(text, at) if text[at] in self._first else 0
            if end:
                out.append(text[start:at])
                out.append(OPEN + text[at:end] + CLOSE)
                start = at = end
            else:
                at += 1
        out.append(text[start:])
        return "".join(out)

    def shield_all(self, value: Any) -> Any:
        """`value` (a message, a tool's definition: JSON-like data) with every string in it
        shielded, keys included."""
        if isinstance(value, str):
            return self.shield(value)
        if isinstance(value, dict):
            return {self.shield(k) if isinstance(k, str) else k: self.shield_all(v)
                    for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.shield_all(item) for item in value]
        return value

    def _match(self, text: str, at: int) -> int:
        node: dict[str, Any] | None = self._trie
        end = 0
        for index in range(at, len(text)):
            assert node is not None
            node = node.get(text[index])
            if node is None:
                break
            if "" in node:
                end = index + 1
        return end


def pieces(rendered: str) -> list[tuple[str, bool]]:
    """`rendered` cut at its wrapped stretches: (text, True) where special tokens are parsed,
    (text, False) for a stretch of content to tokenize as its characters. The marks are gone;
    one without its pair is dropped."""
    out: list[tuple[str, bool]] = []
    rest = rendered
    while rest:
        start = rest.find(OPEN)
        end = rest.find(CLOSE, start + 1) if start >= 0 else -1
        if start < 0 or end < 0:
            out.append((rest.replace(OPEN, "").replace(CLOSE, ""), True))
            break
        before, inner = rest[:start], rest[start + 1:end]
        if OPEN in inner:  # a mark without its pair: the later one opens the stretch
            cut = inner.rfind(OPEN)
            before, inner = before + inner[:cut], inner[cut + 1:]
        out.append((before.replace(CLOSE, ""), True))
        out.append((inner, False))
        rest = rest[end + 1:]
    return [(text, special) for text, special in out if text]


def tokenize_rendered(rendered: str, special: Callable[[str], list[int]],
                      plain: Callable[[str], list[int]]) -> list[int]:
    """The tokens of a rendering: `special` (control tokens parsed) for the template's text
    and unwrapped content, `plain` (no special tokens) for each wrapped stretch."""
    if OPEN not in rendered and CLOSE not in rendered:
        return special(rendered)
    out: list[int] = []
    for text, parsed in pieces(rendered):
        out.extend(special(text) if parsed else plain(text))
    return out
