"""Turning a path of the tree into tokens, node by node, with the model's own chat template.

Each node keeps the tokens it was first rendered to (docs/architecture.md, "Tokens belong to
nodes"): a node's slice is what the template adds when that node is appended to its ancestors. A
path's tokens are its nodes' tokens plus the generation prompt, so a path's prefix never changes
when the conversation grows, whatever the template does to earlier turns.

A reply is the one node a template may render differently once the conversation goes on
(Qwen3's drops the reasoning of every reply before the last user message). Its tokens are fixed
as the template renders it in those later turns, so a follow-up reads what the template would
render for the whole conversation, and its prefix is still the stored path. A reply the template
renders alike either way keeps what the model read and wrote.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import string
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.core.attachments import documents_of, message_content
from engine.core.call_formats import ToolFormat, ToolSupport, tool_format
from engine.core.errors import ArborError, Cancelled
from engine.core.prefix import common_prefix
from engine.core.results import CancelFn
from engine.core.tools import TOOL_CALL_ID, TOOL_CALLS, TOOLS, calls_of, tools_of
from engine.core.tree import Node, Role
from engine.core.untrusted import ControlShield, tokenize_rendered

log = logging.getLogger(__name__)

# The ChatML format most small chat models speak, as Jinja (for tests of the Jinja path).
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SENTINEL = "\u2063ARBOR-SENTINEL\u2063"
_FRAME = "\u2063ARBOR-FRAME\u2063"  # a message's content while learning its frame
# Untokenized nodes from which one rendering of the path is cut up (`_Tiling`) rather
# than each node rendered after its ancestors.
TILE_FROM = 6
_KEPT_RENDERS = 4
_KEPT_DOCUMENT_ENDS = 64


class TemplateError(ArborError):
    """The model's chat template failed to render the conversation."""


class ChatTemplate:
    """A Jinja chat template rendered the way Hugging Face tokenizers render it."""

    def __init__(self, source: str, *, bos_text: str = "", eos_text: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined,
            extensions=["jinja2.ext.loopcontrols", _GenerationTag],
        )
        env.globals["raise_exception"] = _raise_template_exception
        env.filters["tojson"] = _tojson  # as Hugging Face's: no HTML escapes, keys in order
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the model's chat template is invalid: {exc}") from exc
        self.source = source
        self._bos_text = bos_text
        self._eos_text = eos_text
        try:
            self._calling: ToolFormat | None = tool_format(source)
        except ToolSupport:
            self._calling = None
        # Mistral's templates refuse call ids other than 9 letters and digits.
        self._short_ids = "length != 9" in source and "[TOOL_CALLS]" in source
        # A template that takes tools but never reads a message's `tool_calls` (LFM2's):
        # the calls are in the message's text, as the model wrote them.
        self._calls_in_text = self._calling is not None and "tool_calls" not in source

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None) -> str:
        extra = {"tools": [_complete(tool) for tool in tools]} if tools else {}
        if self._short_ids or self._calls_in_text:
            messages = [self._for_template(m) for m in messages]
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_text,
                eos_token=self._eos_text,
                **extra,
            )
        except TemplateError:
            raise
        except Exception as exc:  # a template may fail in many ways on unexpected input
            raise TemplateError(f"the model's chat template failed: {exc}") from exc


    def _for_template(self, message: dict[str, Any]) -> dict[str, Any]:
        """`message` as this template needs it (see __init__)."""
        calls = message.get("tool_calls")
        if self._calls_in_text and calls and self._calling is not None:
            written = self._calling.render([
                (c["function"]["name"], arguments if isinstance(
                    arguments := c["function"]["arguments"], dict) else {}) for c in calls])
            content = message.get("content") or ""
            message = {k: v for k, v in message.items() if k != "tool_calls"}
            message["content"] = f"{content}{written}"
        if self._short_ids:
            if message.get("tool_calls"):
                message = {**message, "tool_calls": [
                    {**c, "id": short_call_id(str(c.get("id", "")))}
                    for c in message["tool_calls"]]}
            if "tool_call_id" in message:
                message = {**message, "tool_call_id": short_call_id(message["tool_call_id"])}
        return message


def _complete(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as templates read it: some read a function's description and parameters
    without asking whether it has them (OpenAI's API makes both optional)."""
    function = tool.get("function")
    if not isinstance(function, dict) or ("description" in function and "parameters" in function):
        return tool
    return {**tool, "function": {"description": "",
                                 "parameters": {"type": "object", "properties": {}},
                                 **function}}


def short_call_id(call_id: str) -> str:
    """A call id as Mistral's templates take it: 9 letters and digits; the same for the same
    id, so a call and its result still match."""
    if re.fullmatch(r"[A-Za-z0-9]{9}", call_id):
        return call_id
    digest = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    alphabet = string.ascii_letters + string.digits
    out = []
    for _ in range(9):
        digest, index = divmod(digest, len(alphabet))
        out.append(alphabet[index])
    return "".join(out)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}`, which Hugging Face's renderer knows (it marks
    what the assistant wrote, for training masks): rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's Extension declares it so)

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class Template(Protocol):
    """Renders a list of messages to the prompt text."""

    @property
    def source(self) -> str | None:
        """The Jinja source; None for llama.cpp's built-in templates."""

    def render(
        self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> str: ...


ApplyFn = Callable[..., str]  # (name, messages, *, add_generation_prompt) -> text


class BuiltinTemplate:
    """One of llama.cpp's built-in templates, by name (see `engine.core.templates`)."""

    source = None

    def __init__(self, name: str, apply: ApplyFn) -> None:
        self.name = name
        self._apply = apply

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None) -> str:
        if tools or any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
            raise TemplateError(f"llama.cpp's built-in {self.name} template takes no tools")
        try:
            return self._apply(self.name, messages, add_generation_prompt=add_generation_prompt)
        except ValueError as exc:
            raise TemplateError(str(exc)) from exc


def _tojson(value: object, indent: int | None = None, ensure_ascii: bool = False,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Jinja's `tojson` as transformers defines it for chat templates (Jinja's own escapes
    `<`, `>`, `&` and `'` for HTML and sorts keys: not what the model was trained on)."""
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators,
                      sort_keys=sort_keys)


def _raise_template_exception(message: str) -> None:
    raise TemplateError(f"the model's chat template refused the conversation: {message}")


@dataclass(frozen=True)
class Tokenizer:
    """What prompt building needs from a loaded model's vocabulary."""

    tokenize: Callable[[str], list[int]]  # text with special tokens parsed, no BOS added
    bos: int | None  # the BOS token to put first, when the model wants one
    # Text with no special tokens parsed (None: `tokenize`, for vocabularies without them),
    # and the texts of the control tokens, which content never becomes (engine.core.untrusted).
    plain: Callable[[str], list[int]] | None = None
    controls: frozenset[str] = frozenset()


class PromptBuilder:
    """Renders nodes into tokens and assembles the target sequence for a generation."""

    def __init__(self, template: Template, tokenizer: Tokenizer) -> None:
        self._template = template
        self._tok = tokenizer
        self._shield = ControlShield(tokenizer.controls)
        # The last few renderings while `ensure_tokens` runs: a node's "before" is the
        # previous node's "after". Only a few are kept: each may be as long as the path.
        self._renders: OrderedDict[tuple[str, ...], str] | None = None
        self._document_ends: OrderedDict[tuple[object, ...], int] = OrderedDict()
        self._reply_frame = self._find_reply_frame()
        self._reply_opening = self._find_reply_opening()

    def tool_format(self) -> ToolFormat:
        """How this template's model writes tool calls (raises ToolSupport when it takes
        no tools)."""
        return tool_format(self._template.source)

    # --- node tokens -------------------------------------------------------------------

    def ensure_tokens(
        self, path: Sequence[Node], *, cancel: CancelFn | None = None, limit: int | None = None
    ) -> bool:
        """Give every node of `path` that has none its tokens (its slice of the template).

        Many nodes at once (an API request, an imported conversation) are cut from one
        rendering of the path (`_Tiling`), so the work grows with the path, not with its
        square; a node the tiling cannot vouch for is rendered on its own, exactly as a
        single new node is. Raises `Cancelled` between nodes once `cancel` says so. With a
        `limit`, stops once the path's tokens so far reach it, leaving the later nodes
        without tokens, and returns False: the path cannot fit a context of that size.
        """
        missing = [index for index, node in enumerate(path) if node.tokens is None]
        if not missing:
            return True
        self._renders = OrderedDict()
        try:
            tiling = None
            if len(missing) >= TILE_FROM:
                tiling = _Tiling.of(self, path, missing[-1] + 1, cancel)
            total = 0
            for index, node in enumerate(path):
                if cancel is not None and cancel():
                    raise Cancelled()
                if node.tokens is None:
                    text = tiling.pieces.get(index) if tiling is not None else None
                    if text is None:
                        text = self._node_text(path, index)
                    node.tokens = tuple(self._node_tokens(index, text))
                total += len(node.tokens)
                if limit is not None and total >= limit and index < missing[-1]:
                    return False
            return True
        finally:
            self._renders = None

    def path_tokens(self, path: Sequence[Node]) -> list[int]:
        self.ensure_tokens(path)
        out: list[int] = []
        for node in path:
            assert node.tokens is not None
            out.extend(node.tokens)
        return out

    def marks(self, path: Sequence[Node]) -> list[int]:
        """The path's structural positions for its decode schedule (`engine.core.schedule`):
        where each node ends and, inside each reply, where its generation prompt ends (the
        end of the prompt that produced it, so the checkpoint taken there fits the next
        turn). Not the end of the node before such a reply, where replies keep their opening
        (`replies_keep_opening`): the prompt that produced the reply was decoded as that node
        and its generation prompt in one chunk (`target_marks`), as a few tokens alone cost a
        whole pass over the weights (36 ms on a Mamba 12x768, against 2.7 ms a token in the
        chunk before them), and the state at the opening serves every path the state a few
        tokens earlier would. A function of the nodes alone (their tokens and the
        `prompt_len` a reply keeps), whatever template is chosen later; the same for every
        prefix of the path but at the prefix's end (which is a chunk end anyway)."""
        self.ensure_tokens(path)
        joined = self.replies_keep_opening
        out: list[int] = []
        position = 0
        for index, node in enumerate(path):
            assert node.tokens is not None
            inside = self.document_end(path, index)
            if inside is not None:
                out.append(position + inside)
            if node.role is Role.ASSISTANT:
                opening = node.meta.get("prompt_len")
                if not isinstance(opening, int) or not 0 < opening <= len(node.tokens):
                    opening = self.reply_opening(node.tokens)  # imported replies
                if opening is not None:
                    if joined and out and out[-1] == position:
                        out.pop()
                    out.append(position + opening)
            position += len(node.tokens)
            out.append(position)
        return out

    def document_end(self, path: Sequence[Node], index: int) -> int | None:
        """Where the documents of user node `index` end in its tokens (engine.core.attachments),
        if it has any: the tokens it shares with its rendering without the user's text. A
        function of the node and the path before it; found once per node's tokens."""
        node = path[index]
        if node.role is not Role.USER or node.tokens is None:
            return None
        documents = documents_of(node.meta)
        if not documents:
            return None
        key = (node.tokens, tuple(d.sha256 for d in documents), node.text)
        found = self._document_ends.get(key)
        if found is None:
            alone = Node(id=node.id, parent=node.parent, role=Role.USER, text="",
                         created=node.created, meta=dict(node.meta))
            tokens = self._render_node([*path[:index], alone], index)
            found = common_prefix(tokens, node.tokens)
            self._document_ends[key] = found
            while len(self._document_ends) > _KEPT_DOCUMENT_ENDS:
                self._document_ends.popitem(last=False)
        return found if 0 < found < len(node.tokens) else None

    def document_ends(self, path: Sequence[Node]) -> list[int]:
        """Where the documents end on `path`, as positions (see `document_end`)."""
        out, position = [], 0
        for index, node in enumerate(path):
            inside = self.document_end(path, index)
            if inside is not None:
                out.append(position + inside)
            position += len(node.tokens or ())
        return out

    def target_marks(self, path: Sequence[Node]) -> list[int]:
        """The marks of `target(path)`: the path's, but its end where replies keep their
        opening, so that the last message and the generation prompt decode as one chunk, as
        `marks` splits the path once the reply is on it."""
        out = self.marks(path)
        if out and self.replies_keep_opening:
            out.pop()
        return out

    @functools.cached_property
    def replies_keep_opening(self) -> bool:
        """Whether a reply's tokens start with the generation prompt it was written after
        (most templates; not one whose generation prompt opens the reasoning that the
        reply's later rendering drops, as Qwen 3.5's does). Then the state at a prompt's end
        is a prefix of every later path through its reply, and the state at the end of the
        message before it adds nothing. Found once, on a probe reply."""
        user = Node(id=-1, parent=None, role=Role.USER, text="Hi", created=0.0)
        try:
            tokens = self.reply_tokens([user], self.tokenize("Hello."), "Hello.")
        except TemplateError:
            return False
        return self.reply_opening(tokens) is not None

    def reply_opening(self, tokens: Sequence[int]) -> int | None:
        """Where the generation prompt ends in a reply's `tokens`, if it starts with it."""
        opening = self._reply_opening
        if opening and len(tokens) >= len(opening) and tuple(tokens[: len(opening)]) == opening:
            return len(opening)
        return None

    def target(self, path: Sequence[Node]) -> list[int]:
        """The tokens to prepare before generating a reply to the last node of `path`."""
        return self.path_tokens(path) + self.generation_prompt(path)

    def generation_prompt(self, path: Sequence[Node]) -> list[int]:
        return self.tokenize(self.generation_prompt_text(path))

    def tokenize(self, text: str) -> list[int]:
        """A rendering's `text` as the model's tokens (no BOS): special tokens parsed in the
        template's text, never in the content it holds (engine.core.untrusted)."""
        return tokenize_rendered(text, self._tok.tokenize, self._tok.plain or self._tok.tokenize)

    def content_tokens(self, text: str) -> list[int]:
        """A message's `text` as the tokens of its characters: no control tokens."""
        return self.tokenize(self._shield.shield(text))

    def reply_tokens(
        self,
        path: Sequence[Node],
        generated: Sequence[int],
        text: str,
        *,
        opening: Sequence[int] | None = None,
    ) -> list[int]:
        """The tokens of a reply generated after `path`: what the template renders for it in
        every later turn.

        Mostly that is exactly what the model produced: the generation prompt (`opening`,
        when the caller has rendered it already) and the generated tokens as they were,
        followed by the template's closing text (e.g. `<|im_end|>\\n`), so the live cache after
        a reply is a prefix of the next prompt, even for recurrent models. Generated tokens
        are kept rather than the text tokenized again, which could split it differently.

        A template that renders the reply otherwise once a message follows it (Qwen3's drops
        its reasoning) gets that rendering, tokenized: the reply's later turns read it so, and
        keeping what the model read would put the dropped reasoning into every later prompt.
        The generation prompt usually starts it, so the prompt-end checkpoint still serves.
        """
        reply = Node(id=-1, parent=None, role=Role.ASSISTANT, text=text, created=0.0)
        if self._reply_frame is None:
            return self._render_node([*path, reply], len(path))
        closing = self._reply_frame[1]
        later = self._later_reply_text(path, reply)
        shown = self._shield.shield(text)
        if later is not None and later != self.generation_prompt_text(path) + shown + closing:
            return self.tokenize(later)
        start = list(opening) if opening is not None else self.generation_prompt(path)
        return start + list(generated) + self.tokenize(closing)

    def open_reply_tokens(self, path: Sequence[Node], reply: Node) -> list[int]:
        """A reply's tokens without its closing text: the prompt to continue it from."""
        open_len = reply.meta.get("open_len")
        if reply.tokens is not None and isinstance(open_len, int) and self._reply_frame:
            return list(reply.tokens[:open_len])
        # Imported or edited replies, and replies stored as the template renders them later
        # (no `open_len`: their tokens lack what the model read, e.g. the reasoning): the
        # generation prompt and the text as the model writes it.
        return self.generation_prompt(path) + self.content_tokens(reply.text)

    # --- internals ---------------------------------------------------------------------

    def _render_node(self, path: Sequence[Node], index: int) -> list[int]:
        return self._node_tokens(index, self._node_text(path, index))

    def _node_tokens(self, index: int, text: str) -> list[int]:
        tokens = self.tokenize(text)
        if index == 0 and self._tok.bos is not None and tokens[:1] != [self._tok.bos]:
            tokens.insert(0, self._tok.bos)
        return tokens

    def _node_text(self, path: Sequence[Node], index: int) -> str:
        """The text of node `index`: what the template adds when it follows path[:index]."""
        node = path[index]
        later = (self._later_reply_text(path[:index], node)
                 if node.role is Role.ASSISTANT else None)
        if later is not None:
            return later
        before = self._render_messages(path[:index])
        after = self._render_messages(path[: index + 1])
        # The template rewrote the earlier turns once this node followed them (a reply
        # that holds its reasoning in its tokens: one given them before replies were
        # stored as rendered later, or one the template's rewriting was not found for).
        cut = len(before) if after.startswith(before) else _rewritten_end(before, after)
        return after[cut:]

    def _later_reply_text(self, path: Sequence[Node], reply: Node) -> str | None:
        """How the template renders `reply` after `path` once a user message follows it,
        when that differs from how it renders it as the last message; None when it does not,
        or when the rewritten reply cannot be told apart from what follows it.

        A probe user message stands for the next turn (the one after a reply is always a
        user's). The reply's later rendering starts where `path`'s rendering ends (the
        replies in `path` are rewritten there already) and ends where the probe's turn
        starts, found as `_rewritten_end` finds where a node starts after rewritten turns.
        """
        probe = Node(id=-2, parent=None, role=Role.USER, text=_SENTINEL, created=0.0)
        last = self._render_messages([*path, reply])
        later = self._render_messages([*path, reply, probe])
        if later.startswith(last):
            return None  # rendered alike whatever follows it
        before = self._render_messages(path)
        # Where the reply starts: after `path`'s rendering, or after its rewritten turns when
        # the reply before this one was rendered as the last message in `before` (two
        # replies in a row), as `_node_text` finds a node after rewritten turns.
        start = len(before) if later.startswith(before) else _kept_tail_end(before, later)
        end = _kept_tail_end(last, later)
        if start is None or end is None or end < start or _SENTINEL not in later[end:]:
            log.warning("chat template rewrites a reply in later turns in a way not found; "
                        "the reply keeps its tokens as the model read them")
            return None
        return later[start:end]

    def generation_prompt_text(self, path: Sequence[Node]) -> str:
        """What the template adds after `path` for the reply to start."""
        messages, tools = self._messages(path), self._tools(path)
        with_prompt = self._template.render(messages, add_generation_prompt=True, tools=tools)
        without = self._template.render(messages, add_generation_prompt=False, tools=tools)
        if not with_prompt.startswith(without):
            log.warning("chat template: generation prompt is not a suffix; using the difference")
        return with_prompt[common_prefix(with_prompt, without):]

    def _render_messages(self, path: Sequence[Node]) -> str:
        messages, tools = self._messages(path), self._tools(path)
        if not messages:
            return ""
        if self._renders is None:
            return self._render_prefix(messages, tools)
        key = (json.dumps(tools), *(json.dumps(m, sort_keys=True) for m in messages))
        text = self._renders.get(key)
        if text is None:
            text = self._renders[key] = self._render_prefix(messages, tools)
            while len(self._renders) > _KEPT_RENDERS:
                self._renders.popitem(last=False)
        else:
            self._renders.move_to_end(key)
        return text

    def _messages(self, path: Sequence[Node]) -> list[dict[str, Any]]:
        """The messages of `path` for the template, their content shielded."""
        messages = _messages(path)
        return [self._shield.shield_all(m) for m in messages] if self._shield else messages

    def _tools(self, path: Sequence[Node]) -> list[dict[str, Any]] | None:
        """The tools the conversation offers, their definitions shielded (an MCP server's
        descriptions are content too)."""
        tools = _tools(path)
        return self._shield.shield_all(tools) if tools and self._shield else tools

    def _shown(self, text: str) -> str:
        """A message's text as it appears in a rendering."""
        return self._shield.shield(text)

    def _render_prefix(self, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None) -> str:
        """The rendering of `messages` as the start of a conversation. A template may refuse
        a conversation that is only a start (Llama 3.1's puts the tools into the first user
        message, and refuses a system prompt with tools and no user message after it): then
        the start is what the template writes before a user message that follows it (the
        common prefix of two renderings with different user messages after it)."""
        try:
            return self._template.render(messages, add_generation_prompt=False, tools=tools)
        except TemplateError as exc:
            if messages[-1]["role"] == "user":
                raise
            refused = exc
        try:
            first, second = (self._template.render(
                [*messages, {"role": "user", "content": probe}], add_generation_prompt=False,
                tools=tools) for probe in (_SENTINEL, _SENTINEL[::-1]))
        except TemplateError:
            raise refused from None
        return first[:common_prefix(first, second)]

    def _find_reply_opening(self) -> tuple[int, ...]:
        """The generation prompt's tokens after a one-message conversation: what a reply
        node's tokens start with (see reply_tokens)."""
        probe = [Node(id=-1, parent=None, role=Role.USER, text="Hi", created=0.0)]
        try:
            return tuple(self.generation_prompt(probe))
        except TemplateError as exc:
            log.warning("chat template: cannot find the generation prompt (%s)", exc)
            return ()

    def _find_reply_frame(self) -> tuple[str, str] | None:
        """The text the template puts before and after an assistant reply's content."""
        probe = [{"role": "user", "content": "Hi"}]
        try:
            before = self._template.render(probe, add_generation_prompt=False)
            after = self._template.render(
                [*probe, {"role": "assistant", "content": _SENTINEL}],
                add_generation_prompt=False,
            )
        except TemplateError as exc:
            log.warning("chat template: cannot find the reply frame (%s)", exc)
            return None
        piece = after[common_prefix(before, after):]
        if piece.count(_SENTINEL) != 1:
            log.warning("chat template rewrites reply text; replies will be re-rendered")
            return None
        opening, closing = piece.split(_SENTINEL)
        return opening, closing


@dataclass(frozen=True)
class _Frame:
    """What the template puts around a message's content when the message comes last."""

    opening: str
    closing: str

    def pieces(self, content: str) -> list[str]:
        """The message as the template may render it: its content as it is first, then
        trimmed (templates that `trim` the content)."""
        shown = dict.fromkeys((content, content.strip(), content.rstrip(), content.lstrip()))
        return [self.opening + text + self.closing for text in shown]


@dataclass(frozen=True)
class _Tiling:
    """The nodes' texts, cut from one rendering of the whole path.

    A node's text is what the template adds when the node follows its ancestors; finding it
    that way renders every prefix of the path, which grows with the square of its length.
    Most templates render each message in a frame of its role (`_Frame`), the same wherever
    it comes: the rendering of the whole path is then the frames one after another, and a
    node's text is its frame. The frames are learned from probes rendered after the path's
    own messages and the whole rendering is checked to be exactly those frames, so a
    template that renders otherwise is found out. A reply followed by a user message is
    also tried in the frame it has when a message follows it (`_Frame` of a reply before a
    probe), with its text found from the two frames as `_later_reply_text` finds it. A node
    neither fits is rendered on its own and the tiling goes on after it where it can. The
    first messages (where templates put their defaults) and the last node are always
    rendered on their own; the last one checks the whole tiling again.
    """

    pieces: dict[int, str]

    @classmethod
    def of(cls, builder: PromptBuilder, path: Sequence[Node], end: int,
           cancel: CancelFn | None) -> _Tiling | None:
        def check() -> None:
            if cancel is not None and cancel():
                raise Cancelled()

        head, seen = 0, 0
        while head < end and seen < 2:
            seen += len(builder._messages(path[head:head + 1]))
            head += 1
        last = end - 1
        if last - head < 2:
            return None
        check()
        if any(_has_tools(node) for node in path[:end]):
            return None  # frames are per role and text; tool calls and results are not that
        full = builder._template.render(builder._messages(path[:end]),
                                        add_generation_prompt=False)
        start = builder._render_messages(path[:head])
        if not full.startswith(start):
            return None
        frames: dict[Role, _Frame | None] = {}
        for index in range(head, last):
            role = path[index].role
            if role not in frames:
                check()
                frames[role] = _learn_frame(builder, path[:index], role)
        user = frames.get(Role.USER)
        probe = user.opening + _SENTINEL + user.closing if user is not None else None
        reply_later = None
        first = next((index for index in range(head, last) if path[index].role
                      is Role.ASSISTANT and path[index + 1].role is Role.USER), None)
        if first is not None and probe is not None:
            check()
            reply_later = _learn_reply_later(builder, path[:first], probe)
        pieces: dict[int, str] = {}
        pos = len(start)
        prev_pos, prev_last = pos, ""  # the previous node: where it starts, its last form
        for index in range(head, last):
            check()
            node = path[index]
            frame = frames[node.role]
            # The ancestors render as they do in the whole rendering.
            consistent = len(prev_last) == pos - prev_pos and full.startswith(prev_last, prev_pos)
            if node.role is Role.SYSTEM and not node.text:
                pieces[index] = ""
                continue
            found = None
            # A reply is vouched for only before a user message: that is the later form its
            # tokens keep; followed by another reply (a continue) the template may render it
            # otherwise (a reasoning template keeps its reasoning there and drops it before
            # a user message), so it is rendered on its own.
            later_known = node.role is not Role.ASSISTANT or path[index + 1].role is Role.USER
            if frame is not None and later_known and (consistent
                                                      or node.role is not Role.ASSISTANT):
                for piece in frame.pieces(builder._shown(_content(node))):
                    if full.startswith(piece, pos):
                        found = (piece, piece)
                        break
            if (found is None and frame is not None and reply_later is not None
                    and probe is not None and consistent and node.role is Role.ASSISTANT
                    and path[index + 1].role is Role.USER):
                shown = builder._shown(node.text)
                for seg, alone in zip(reply_later.pieces(shown), frame.pieces(shown),
                                      strict=True):
                    if full.startswith(seg, pos):
                        found = (seg, alone)
                        break
            if found is not None:
                seg, alone = found
                if node.role is Role.ASSISTANT:
                    pieces[index] = _later_text(alone, seg + probe) if probe else alone
                else:  # as `_node_text` cuts it after the previous node
                    before, after = prev_last, full[prev_pos:pos] + alone
                    cut = (len(before) if after.startswith(before)
                           else _rewritten_end(before, after))
                    pieces[index] = after[cut:]
                prev_pos, prev_last, pos = pos, alone, pos + len(seg)
                continue
            # Not in a frame: rendered on its own, and the tiling goes on after it if the
            # renderings agree with the whole one.
            text = pieces[index] = builder._node_text(path, index)
            before = builder._render_messages(path[:index])
            after = builder._render_messages(path[:index + 1])
            if len(before) != pos or not full.startswith(before) or not after.startswith(before):
                return cls(pieces)  # the rest is rendered node by node
            alone = after[pos:]
            if full.startswith(alone, pos):
                seg = alone
            elif full.startswith(text, pos) and path[index + 1].role is Role.USER:
                seg = text
            else:
                return cls(pieces)
            prev_pos, prev_last, pos = pos, alone, pos + len(seg)
        # The last node's ancestors, rendered as its text will be found: the tiling must agree.
        check()
        before = builder._render_messages(path[:last])
        if before != full[:prev_pos] + prev_last:
            log.info("chat template: the tiling of the path did not hold; rendering its "
                     "nodes one by one")
            return None
        return cls(pieces)


def _learn_frame(builder: PromptBuilder, path: Sequence[Node], role: Role) -> _Frame | None:
    """The frame of a `role` message coming last after `path`, or None if it has none."""
    base = builder._render_messages(path)
    try:
        probe = builder._template.render(
            [*builder._messages(path), {"role": role.value, "content": _FRAME}],
            add_generation_prompt=False, tools=builder._tools(path))
    except TemplateError:
        return None
    piece = probe[len(base) if probe.startswith(base) else _rewritten_end(base, probe):]
    if piece.count(_FRAME) != 1:
        return None
    opening, closing = piece.split(_FRAME)
    return _Frame(opening, closing)


def _learn_reply_later(builder: PromptBuilder, path: Sequence[Node], probe: str
                       ) -> _Frame | None:
    """The frame of a reply after `path` once a user message (`probe`, as rendered last)
    follows it."""
    base = builder._render_messages(path)
    try:
        later = builder._template.render(
            [*builder._messages(path), {"role": "assistant", "content": _FRAME},
             {"role": "user", "content": _SENTINEL}], add_generation_prompt=False,
            tools=builder._tools(path))
    except TemplateError:
        return None
    piece = later[len(base):]
    if not later.startswith(base) or not piece.endswith(probe) or piece.count(_FRAME) != 1:
        return None
    opening, closing = piece[: len(piece) - len(probe)].split(_FRAME)
    return _Frame(opening, closing)


def _later_text(alone: str, later: str) -> str:
    """A reply's text as `_node_text` finds it from its renderings last (`alone`) and
    before the probe user message (`later`), both after the same ancestors."""
    if later.startswith(alone):
        return alone
    end = _kept_tail_end(alone, later)
    if end is None or _SENTINEL not in later[end:]:
        return alone
    return later[:end]


def _messages(path: Sequence[Node]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for node in path:
        if node.role is Role.SYSTEM and not node.text:
            continue  # no system prompt: let the template apply its own default
        message: dict[str, Any] = {"role": node.role.value, "content": _content(node)}
        calls = calls_of(node.meta) if node.role is Role.ASSISTANT else ()
        if calls:
            message["tool_calls"] = [call.to_template() for call in calls]
        if node.role is Role.TOOL:
            call_id = node.meta.get(TOOL_CALL_ID)
            message["tool_call_id"] = call_id if isinstance(call_id, str) else ""
        out.append(message)
    return out


def _content(node: Node) -> str:
    """What the template gets as a node's content: a user's message with its documents."""
    if node.role is Role.USER:
        return message_content(node.text, documents_of(node.meta))
    return node.text


def _tools(path: Sequence[Node]) -> list[dict[str, Any]] | None:
    """The tools the conversation offers (its root's), for the template."""
    return tools_of(path[0].meta) if path and path[0].role is Role.SYSTEM else None


def _has_tools(node: Node) -> bool:
    return node.role is Role.TOOL or any(key in node.meta for key in (TOOLS, TOOL_CALLS))


def _rewritten_end(before: str, after: str) -> int:
    """Where the new node starts in `after` when the template rendered the earlier turns
    differently once the node followed them (`before` is their rendering without it).

    Templates that drop the reasoning of earlier replies (Qwen3's, DeepSeek-R1's) cut the
    front of a reply's content and keep its end (the answer and the turn's closing text), so
    the earlier turns in `after` end as they end in `before`: they run up to the longest
    stretch after the common prefix that `before` ends with. The new node is what follows.
    Still needed although replies are stored as rendered later: `before` renders the reply
    before the new node as the last message, and replies stored before that, or imported
    with their tokens, hold the reasoning they were read with.
    """
    end = _kept_tail_end(before, after)
    cut = common_prefix(before, after)
    if end is None:
        log.warning("chat template rewrote earlier turns; node keeps only its new text")
        return cut
    log.info("chat template rewrote earlier turns (%d characters kept of %d); the new "
             "node starts after them", end - cut, len(before) - cut)
    return end


def _kept_tail_end(before: str, after: str) -> int | None:
    """Where the rewritten earlier turns end in `after` (see `_rewritten_end`): after the
    common prefix, the longest stretch of `after` that `before` ends with; None if none."""
    cut = common_prefix(before, after)
    rewritten, rest = before[cut:], after[cut:]
    last = rewritten[-1:]
    end = next((n for n in range(min(len(rewritten), len(rest)), 0, -1)
                if rest[n - 1] == last and rewritten.endswith(rest[:n])), 0)
    return cut + end if end else None


