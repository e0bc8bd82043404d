"""ChatGPT `conversations.json`: the shapes of its conversations, read and checked.

The export is a JSON array of conversations. Each holds a `mapping` from node id to
`{"id", "message", "parent", "children"}` and a `current_node` (the active leaf). The file
comes from elsewhere, so everything is checked: types, that `children` and `parent` agree,
that the nodes form one tree, and the limits of `engine.core.records`.

Here: the mapping's nodes (`Entry`) and their messages (`Message`: what the import makes of
each, and whether it is a tool call or a result, as `chatgpt_calls` describes), the checks of
their links and order, the checks of single values (each failure a FormatError of one line),
and the keys Arbor adds to the format, which the import (`chatgpt_import`, `chatgpt_calls`)
and the export (`chatgpt_export`) share.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NoReturn

from engine.core.records import MAX_NODES
from engine.core.tree import Role
from engine.files.regular import FormatError
from engine.files.strict_json import describe, loads_strict

MAX_TIMESTAMP = 32_503_680_000.0  # 3000-01-01T00:00:00Z: anything later is not a real time
TEXT_CONTENT_TYPES = frozenset({"text", "multimodal_text"})
ARBOR_CALL_ID = "arbor_tool_call_id"  # message metadata: the call a message makes or answers
ARBOR_TOOLS = "arbor_tools"  # conversation key: the tools offered (the root's TOOLS)
_KEPT_ROLES = {"user": Role.USER, "assistant": Role.ASSISTANT}
_SKIPPED_ROLES = frozenset({"system", "tool"})  # system: the prompt at the top, or dropped
_UNFINISHED = frozenset({"in_progress", "finished_partial_completion"})
_ARGUMENT_LANGUAGES = frozenset({"json", "unknown"})  # code content that holds arguments
MISSING: Any = object()


# --- nodes and messages --------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    role: str
    text: str | None  # None: the content has no text part at all
    created: float
    hidden: bool  # metadata.is_visually_hidden_from_conversation
    recipient: str | None  # "all" (or none): the user; anything else names a tool
    unfinished: bool
    tool_name: str | None = None  # author.name: the tool that wrote a tool message
    arguments: str | None = None  # a call's arguments (None: not a call)
    arbor_id: str | None = None  # metadata.arbor_tool_call_id: the call it makes or answers
    by_arbor: bool = False  # Arbor wrote this call or result: taken as written

    @property
    def to_tool(self) -> bool:
        return self.recipient not in (None, "all")

    @property
    def is_call(self) -> bool:
        return self.arguments is not None

    @property
    def kept_role(self) -> Role | None:
        """The role this message has in Arbor, or None when it is skipped."""
        if self.text is None or self.hidden or self.to_tool or self.role in _SKIPPED_ROLES:
            return None
        return _KEPT_ROLES.get(self.role, Role.USER)  # an unknown role: shown as the user's

    @property
    def kept_text(self) -> str:
        """The text of a kept message; one of an unknown role names it."""
        text = self.text or ""
        return text if self.role in _KEPT_ROLES else f"[{self.role[:40]}]\n{text}"

    @property
    def answers(self) -> bool:
        """A tool message that may answer a call: Arbor's result, or one with text."""
        if self.hidden or self.role != "tool":
            return False
        return self.by_arbor or (self.text is not None and self.text.strip() != "")


@dataclass(frozen=True)
class Entry:
    id: str
    parent: str | None
    children: tuple[str, ...]
    message: Message | None


def parse_mapping(raw: Any, label: str) -> dict[str, Entry]:
    mapping = require_dict(raw, f"{label}: mapping")
    if not mapping:
        fail(f"{label} has no messages")
    if len(mapping) > MAX_NODES:
        fail(f"{label} has {len(mapping)} nodes; the limit is {MAX_NODES}")
    return {key: _parse_entry(key, value, label) for key, value in mapping.items()}


def _parse_entry(key: str, raw: Any, label: str) -> Entry:
    where = f"{label}, node {short(key)}"
    node = require_dict(raw, where)
    node_id = require_str(node.get("id", key), f"{where}: id")
    if node_id != key:
        fail(f"{where} has the id {short(node_id)}; the two must be the same")
    parent = optional_str(node.get("parent"), f"{where}: parent")
    children = require_list(node.get("children", []), f"{where}: children")
    message = node.get("message")
    return Entry(
        id=node_id,
        parent=parent,
        children=tuple(require_str(child, f"{where}: a child id") for child in children),
        message=None if message is None else _parse_message(message, where),
    )


def _parse_message(raw: Any, where: str) -> Message:
    message = require_dict(raw, f"{where}: message")
    optional_str(message.get("id"), f"{where}: message.id")
    author = require_dict(message.get("author", MISSING), f"{where}: message.author")
    role = require_str(author.get("role", MISSING), f"{where}: message.author.role")
    content = require_dict(message.get("content", MISSING), f"{where}: message.content")
    metadata = message.get("metadata")
    metadata = {} if metadata is None else require_dict(metadata, f"{where}: message.metadata")
    recipient = optional_str(message.get("recipient"), f"{where}: message.recipient")
    status = optional_str(message.get("status"), f"{where}: message.status")
    plain = Message(
        role=role,
        text=_content_text(content, f"{where}: message.content"),
        created=parse_time(message.get("create_time"), f"{where}: message.create_time"),
        hidden=metadata.get("is_visually_hidden_from_conversation") is True,
        recipient=recipient,
        unfinished=status in _UNFINISHED,
    )
    if role not in ("assistant", "tool") or plain.hidden:
        return plain  # neither a call nor a result: nothing more is read
    arbor_id = optional_str(metadata.get(ARBOR_CALL_ID),
                             f"{where}: message.metadata.{ARBOR_CALL_ID}")
    if role == "tool":
        return replace(
            plain,
            text=_result_text(content, plain.text, f"{where}: message.content"),
            tool_name=optional_str(author.get("name"), f"{where}: message.author.name"),
            arbor_id=arbor_id,
            by_arbor=ARBOR_CALL_ID in metadata,
        )
    if recipient is None or (arbor_id is None and not plain.to_tool):
        return plain  # addressed to the user
    arguments = _call_text(content, plain.text, f"{where}: message.content")
    if arguments is None:
        return plain
    if arbor_id is not None:  # Arbor's call (to whatever tool name): as written
        return replace(plain, arguments=arguments, arbor_id=arbor_id, by_arbor=True)
    if _is_json_object(arguments):  # ChatGPT's: a call when it sends a JSON object
        return replace(plain, arguments=arguments)
    return plain


def _content_text(content: dict[str, Any], where: str) -> str | None:
    """The string parts joined with newlines; None when there are none (code, images...)."""
    content_type = require_str(content.get("content_type", MISSING), f"{where}.content_type")
    if content_type not in TEXT_CONTENT_TYPES:
        return None
    parts = require_list(content.get("parts", MISSING), f"{where}.parts")
    texts = [part for part in parts if isinstance(part, str)]
    return "\n".join(texts) if texts else None


def _call_text(content: dict[str, Any], text: str | None, where: str) -> str | None:
    """What a message addressed to a tool sends it: the code of a code content in JSON (or
    of no said language), or the text. None for code in a programming language."""
    if content["content_type"] != "code":
        return text
    language = optional_str(content.get("language"), f"{where}.language")
    if language is not None and language not in _ARGUMENT_LANGUAGES:
        return None
    return require_str(content.get("text", MISSING), f"{where}.text")


def _result_text(content: dict[str, Any], text: str | None, where: str) -> str | None:
    """A tool message's text: its string parts, or the text of the error it reports."""
    if content["content_type"] == "system_error":
        return require_str(content.get("text", MISSING), f"{where}.text")
    return text


def _is_json_object(text: str) -> bool:
    if not text.lstrip().startswith("{"):
        return False
    try:
        value = loads_strict(text, max_bytes=4 * len(text))
    except FormatError:
        return False
    return isinstance(value, dict)


def check_links(entries: dict[str, Entry], label: str) -> Entry:
    """Check that `children` and `parent` agree everywhere; return the one root."""
    listed: set[str] = set()
    for entry in entries.values():
        where = f"{label}, node {short(entry.id)}"
        for child in entry.children:
            kid = entries.get(child)
            if kid is None:
                fail(f"{where} lists a child {short(child)} that is not in the mapping")
            if kid.parent != entry.id:
                fail(
                    f"{where} lists {short(child)} as a child, but its parent is "
                    f"{short(kid.parent) if kid.parent is not None else 'none'}"
                )
            if child in listed:  # only its parent may list it, so this is a repeat there
                fail(f"{where} lists the child {short(child)} twice")
            listed.add(child)
        if entry.parent is not None and entry.parent not in entries:
            fail(f"{where} has a parent {short(entry.parent)} that is not in the mapping")
    for entry in entries.values():
        if entry.parent is not None and entry.id not in listed:
            fail(
                f"{label}, node {short(entry.id)} has the parent {short(entry.parent)}, "
                f"which does not list it as a child"
            )
    roots = [entry for entry in entries.values() if entry.parent is None]
    if len(roots) != 1:
        fail(f"{label}: the mapping has {len(roots)} roots; a conversation has exactly one")
    return roots[0]


def tree_order(entries: dict[str, Entry], root: Entry, label: str) -> list[str]:
    """Node ids from the root, parents first, siblings in listed order.

    After `check_links` every node is listed by its parent alone and only once, so the walk
    visits each node at most once; whatever it does not reach sits on a cycle.
    """
    order: list[str] = []
    stack = [root.id]
    while stack:
        node_id = stack.pop()
        order.append(node_id)
        stack.extend(reversed(entries[node_id].children))
    if len(order) != len(entries):
        fail(
            f"{label}: messages form a cycle ({len(entries) - len(order)} of them cannot be "
            f"reached from the root)"
        )
    return order


# --- checking values -----------------------------------------------------------------------


def fail(message: str) -> NoReturn:
    raise FormatError(message)


def _kind(value: Any) -> str:
    """How a JSON value is described in an error message."""
    return "missing" if value is MISSING else describe(value)


def require_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        fail(f"{where} must be an object, but is {_kind(value)}")
    return value


def require_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        fail(f"{where} must be an array, but is {_kind(value)}")
    return value


def require_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        fail(f"{where} must be a string, but is {_kind(value)}")
    return value


def optional_str(value: Any, where: str) -> str | None:
    return None if value is None else require_str(value, where)


def parse_time(value: Any, where: str) -> float:
    """Seconds since 1970; null (or absent) is 0.0. Non-numbers and absurd times are rejected."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        fail(f"{where} must be a number or null, but is {_kind(value)}")
    if not 0.0 <= value <= MAX_TIMESTAMP:
        fail(f"{where} is {value}, which is not a time between 1970 and 3000")
    return float(value)


def short(text: str, limit: int = 40) -> str:
    """A one-line quotation of `text` for an error message."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


__all__ = [
    "ARBOR_CALL_ID",
    "ARBOR_TOOLS",
    "MAX_TIMESTAMP",
    "MISSING",
    "TEXT_CONTENT_TYPES",
    "Entry",
    "Message",
    "check_links",
    "fail",
    "optional_str",
    "parse_mapping",
    "parse_time",
    "require_dict",
    "require_list",
    "require_str",
    "short",
    "tree_order",
]
