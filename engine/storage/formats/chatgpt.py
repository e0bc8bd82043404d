"""ChatGPT `conversations.json`: import every branch of every conversation, and export.

The export is a JSON array of conversations. Each holds a `mapping` from node id to
`{"id", "message", "parent", "children"}` and a `current_node` (the active leaf). The file
comes from elsewhere, so everything is checked: types, that `children` and `parent` agree,
that the nodes form one tree, and the limits of `engine.core.records`.

What becomes of the messages:
- user and assistant messages with text become nodes (string parts joined with "\\n",
  non-string parts such as images dropped);
- system messages above the first user/assistant message become the system prompt (the
  hidden one ChatGPT puts at the top usually has no text, giving an empty prompt);
- a message with text whose role is none of ChatGPT's (system, user, assistant, tool) becomes
  a user message whose text starts with its role in brackets: kept visibly, never dropped;
- tool calls and their results, as below;
- everything else is skipped and its children re-parented to its nearest kept ancestor:
  unanswered calls, tool messages that answer no call, messages hidden from the conversation,
  messages without text (code, browsing, reasoning...), and system messages further down. A
  `current_node` on a skipped message moves to that ancestor.

Tool calls (`engine.core.tools`), as real exports hold them (exports of 2023-2025 published
in public repositories): a call is an assistant message whose `recipient` names the tool
("all" is the user), its arguments a JSON object in `content: {"content_type": "code",
"language": "json", "text": ...}` (canvas), in code of language "unknown" (web.run, plugins,
GPT actions), or in a text part (dalle.text2im, some canvas calls); its result is a message
below it from `author: {"role": "tool", "name": <the tool>}`, its text in `parts` (a
`system_error`'s in `text`). On import:
- a message addressed to a tool is a call when it sends a JSON object. It is a call of the
  assistant message above it when only skipped messages and calls stand between them, on a
  path without branches; otherwise an empty reply is made for it (its id is the call's).
  Calls in a row are one reply's (OpenAI's parallel calls).
- a tool message with text answers the first call of its name, in the run of calls above it
  (reached through earlier tool messages), that no tool message on its path answered
  already; it becomes a tool node. Two tool messages below one call are two results on two
  branches.
- a call that nothing answers is skipped: no call reaches the model without a result, and
  none that the file did not make. Skipped so: the code interpreter (`python`: its code is no
  JSON object, its `execution_output` no text part), the old browser's `search("...")`
  commands, and the web.run and DALL·E exchanges whose tool messages have no text (search
  results live in metadata, images are asset pointers); hidden messages are neither calls
  nor results.
Arbor marks the calls and results it writes with the call's id in
`metadata.arbor_tool_call_id`, a key ChatGPT's readers ignore; these are read as written,
answered or not. The tools the conversation offered go in the conversation's own
`arbor_tools` key (readers take the keys they know). So a file Arbor wrote comes back with
the same calls, results and tools.

Export writes a reply that calls tools as its text, an ordinary message (left out when
empty, unless the reply is the only child of an assistant reply, whose calls they would be
read as), then each call as an assistant message of `recipient` = the tool's name and
`content: {"content_type": "code", "language": "json", "text": <arguments>}`, one below the
other; a tool node as a message of `author: {"role": "tool", "name": <the tool>}`.

The conversations are parsed one at a time and the count limit is checked as they come, so
memory holds the decoded text, one conversation's JSON and the records made so far.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from engine.core.records import MAX_NODES, ConversationRecord, NodeRecord
from engine.core.tools import TOOL_CALL_ID, TOOL_CALLS, TOOLS, ToolCall, calls_of, tools_of
from engine.core.tree import NodeStatus, Role
from engine.files.regular import FormatError
from engine.files.strict_json import (
    NotAnArrayError,
    describe,
    dumps_strict,
    iter_array_strict,
    loads_strict,
)
from engine.storage.formats import check_record

log = logging.getLogger(__name__)

MAX_CONVERSATIONS = 10_000
MAX_TIMESTAMP = 32_503_680_000.0  # 3000-01-01T00:00:00Z: anything later is not a real time
TEXT_CONTENT_TYPES = frozenset({"text", "multimodal_text"})
ARBOR_CALL_ID = "arbor_tool_call_id"  # message metadata: the call a message makes or answers
ARBOR_TOOLS = "arbor_tools"  # conversation key: the tools offered (the root's TOOLS)
_KEPT_ROLES = {"user": Role.USER, "assistant": Role.ASSISTANT}
_SKIPPED_ROLES = frozenset({"system", "tool"})  # system: the prompt at the top, or dropped
_UNFINISHED = frozenset({"in_progress", "finished_partial_completion"})
_ARGUMENT_LANGUAGES = frozenset({"json", "unknown"})  # code content that holds arguments
_EXPORT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://arbor.invalid/formats/chatgpt")
_MISSING: Any = object()


# --- reading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Message:
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
class _Entry:
    id: str
    parent: str | None
    children: tuple[str, ...]
    message: _Message | None


def parse_chatgpt(data: bytes, *, max_bytes: int = 256 << 20) -> list[ConversationRecord]:
    """Every conversation of a ChatGPT export, all branches kept; FormatError if malformed."""
    records: list[ConversationRecord] = []
    try:
        for raw in iter_array_strict(data, max_bytes=max_bytes):
            if len(records) == MAX_CONVERSATIONS:
                _fail(f"the file holds more than {MAX_CONVERSATIONS} conversations; the limit "
                      f"is {MAX_CONVERSATIONS}")
            records.append(_parse_conversation(raw, len(records) + 1))
    except NotAnArrayError as error:
        _fail(f"a ChatGPT export is a JSON array of conversations, but this file holds "
              f"{error.kind}")
    return records


def _parse_conversation(raw: Any, number: int) -> ConversationRecord:
    label = f"conversation {number}"
    conversation = _require_dict(raw, label)
    title = _optional_str(conversation.get("title"), f"{label}: title")
    title = title if title is not None and title.strip() else "Untitled"
    label = f"conversation {number} ({_short(title)})"
    created = _time(conversation.get("create_time"), f"{label}: create_time")
    updated = _time(conversation.get("update_time"), f"{label}: update_time")
    tools = _parse_tools(conversation.get(ARBOR_TOOLS), f"{label}: {ARBOR_TOOLS}")
    entries = _parse_mapping(conversation.get("mapping", _MISSING), label)
    root = _check_links(entries, label)
    order = _tree_order(entries, root, label)
    current = _require_str(conversation.get("current_node", _MISSING), f"{label}: current_node")
    if current not in entries:
        _fail(f"{label}: current_node {_short(current)} is not in the mapping")
    calls = _pair_calls(entries, root, label)
    record = _build_record(title, created, updated, entries, order, current, calls, tools)
    check_record(record)
    skipped = len(entries) - len(record.nodes) - calls.merged
    if skipped > 0:
        log.info("%s: skipped %d messages that are not user or assistant text, tool calls "
                 "or their results", label, skipped)
    return record


def _parse_tools(raw: Any, where: str) -> list[Any]:
    """Arbor's own key: the tools the conversation offered, OpenAI's function tools."""
    if raw is None:
        return []
    tools = _require_list(raw, where)
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            _fail(f"{where} must be a list of function tools, each with a name")
    return tools


def _parse_mapping(raw: Any, label: str) -> dict[str, _Entry]:
    mapping = _require_dict(raw, f"{label}: mapping")
    if not mapping:
        _fail(f"{label} has no messages")
    if len(mapping) > MAX_NODES:
        _fail(f"{label} has {len(mapping)} nodes; the limit is {MAX_NODES}")
    return {key: _parse_entry(key, value, label) for key, value in mapping.items()}


def _parse_entry(key: str, raw: Any, label: str) -> _Entry:
    where = f"{label}, node {_short(key)}"
    node = _require_dict(raw, where)
    node_id = _require_str(node.get("id", key), f"{where}: id")
    if node_id != key:
        _fail(f"{where} has the id {_short(node_id)}; the two must be the same")
    parent = _optional_str(node.get("parent"), f"{where}: parent")
    children = _require_list(node.get("children", []), f"{where}: children")
    message = node.get("message")
    return _Entry(
        id=node_id,
        parent=parent,
        children=tuple(_require_str(child, f"{where}: a child id") for child in children),
        message=None if message is None else _parse_message(message, where),
    )


def _parse_message(raw: Any, where: str) -> _Message:
    message = _require_dict(raw, f"{where}: message")
    _optional_str(message.get("id"), f"{where}: message.id")
    author = _require_dict(message.get("author", _MISSING), f"{where}: message.author")
    role = _require_str(author.get("role", _MISSING), f"{where}: message.author.role")
    content = _require_dict(message.get("content", _MISSING), f"{where}: message.content")
    metadata = message.get("metadata")
    metadata = {} if metadata is None else _require_dict(metadata, f"{where}: message.metadata")
    recipient = _optional_str(message.get("recipient"), f"{where}: message.recipient")
    status = _optional_str(message.get("status"), f"{where}: message.status")
    plain = _Message(
        role=role,
        text=_content_text(content, f"{where}: message.content"),
        created=_time(message.get("create_time"), f"{where}: message.create_time"),
        hidden=metadata.get("is_visually_hidden_from_conversation") is True,
        recipient=recipient,
        unfinished=status in _UNFINISHED,
    )
    if role not in ("assistant", "tool") or plain.hidden:
        return plain  # neither a call nor a result: nothing more is read
    arbor_id = _optional_str(metadata.get(ARBOR_CALL_ID),
                             f"{where}: message.metadata.{ARBOR_CALL_ID}")
    if role == "tool":
        return replace(
            plain,
            text=_result_text(content, plain.text, f"{where}: message.content"),
            tool_name=_optional_str(author.get("name"), f"{where}: message.author.name"),
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
    content_type = _require_str(content.get("content_type", _MISSING), f"{where}.content_type")
    if content_type not in TEXT_CONTENT_TYPES:
        return None
    parts = _require_list(content.get("parts", _MISSING), f"{where}.parts")
    texts = [part for part in parts if isinstance(part, str)]
    return "\n".join(texts) if texts else None


def _call_text(content: dict[str, Any], text: str | None, where: str) -> str | None:
    """What a message addressed to a tool sends it: the code of a code content in JSON (or
    of no said language), or the text. None for code in a programming language."""
    if content["content_type"] != "code":
        return text
    language = _optional_str(content.get("language"), f"{where}.language")
    if language is not None and language not in _ARGUMENT_LANGUAGES:
        return None
    return _require_str(content.get("text", _MISSING), f"{where}.text")


def _result_text(content: dict[str, Any], text: str | None, where: str) -> str | None:
    """A tool message's text: its string parts, or the text of the error it reports."""
    if content["content_type"] == "system_error":
        return _require_str(content.get("text", _MISSING), f"{where}.text")
    return text


def _is_json_object(text: str) -> bool:
    if not text.lstrip().startswith("{"):
        return False
    try:
        value = loads_strict(text, max_bytes=4 * len(text))
    except FormatError:
        return False
    return isinstance(value, dict)


def _check_links(entries: dict[str, _Entry], label: str) -> _Entry:
    """Check that `children` and `parent` agree everywhere; return the one root."""
    listed: set[str] = set()
    for entry in entries.values():
        where = f"{label}, node {_short(entry.id)}"
        for child in entry.children:
            kid = entries.get(child)
            if kid is None:
                _fail(f"{where} lists a child {_short(child)} that is not in the mapping")
            if kid.parent != entry.id:
                _fail(
                    f"{where} lists {_short(child)} as a child, but its parent is "
                    f"{_short(kid.parent) if kid.parent is not None else 'none'}"
                )
            if child in listed:  # only its parent may list it, so this is a repeat there
                _fail(f"{where} lists the child {_short(child)} twice")
            listed.add(child)
        if entry.parent is not None and entry.parent not in entries:
            _fail(f"{where} has a parent {_short(entry.parent)} that is not in the mapping")
    for entry in entries.values():
        if entry.parent is not None and entry.id not in listed:
            _fail(
                f"{label}, node {_short(entry.id)} has the parent {_short(entry.parent)}, "
                f"which does not list it as a child"
            )
    roots = [entry for entry in entries.values() if entry.parent is None]
    if len(roots) != 1:
        _fail(f"{label}: the mapping has {len(roots)} roots; a conversation has exactly one")
    return roots[0]


def _tree_order(entries: dict[str, _Entry], root: _Entry, label: str) -> list[str]:
    """Node ids from the root, parents first, siblings in listed order.

    After `_check_links` every node is listed by its parent alone and only once, so the walk
    visits each node at most once; whatever it does not reach sits on a cycle.
    """
    order: list[str] = []
    stack = [root.id]
    while stack:
        node_id = stack.pop()
        order.append(node_id)
        stack.extend(reversed(entries[node_id].children))
    if len(order) != len(entries):
        _fail(
            f"{label}: messages form a cycle ({len(entries) - len(order)} of them cannot be "
            f"reached from the root)"
        )
    return order


@dataclass
class _Run:
    """The calls of one reply: a run of call messages, after the reply's text or not."""

    made: bool  # no text message above: the reply is made for the calls
    calls: list[str] = field(default_factory=list)  # the call entries, in order
    by_name: dict[str, list[str]] = field(default_factory=dict)  # ChatGPT's: per tool
    taken: Counter[str] = field(default_factory=Counter)  # per tool: answered on this path
    kept: list[str] = field(default_factory=list)  # the calls kept, once paired


@dataclass
class _Calls:
    """Which messages are calls and results: what `_build_record` needs of the pairing."""

    runs: dict[str, _Run]  # a call entry, or a reply's text entry -> its reply's run
    calls: dict[str, ToolCall]  # a kept call's entry -> the call
    answers: dict[str, str | None]  # a result's entry -> the call id it answers (None: none)

    def kept(self, entry_id: str) -> bool:
        return entry_id in self.calls

    @property
    def merged(self) -> int:
        """Kept calls that are no node of their own (all but a made reply's first)."""
        made = sum(1 for key, run in self.runs.items() if run.kept and run.kept[0] == key
                   and run.made)
        return len(self.calls) - made


_Lead = _Run | str | None  # what a call would join: a run, a reply's text entry, or nothing


@dataclass
class _Pairing:
    """One walk of the mapping, entering and leaving each node, that finds the calls, the
    replies they belong to and the results that answer them. A run's `taken` counts the
    results on the path being walked, so a branch's results leave the calls unanswered for
    its sibling branches. Each node costs O(1), whatever the file."""

    entries: dict[str, _Entry]
    runs: dict[str, _Run] = field(default_factory=dict)
    leads: dict[str, _Lead] = field(default_factory=dict)  # what a call below would join
    above: dict[str, _Run | None] = field(default_factory=dict)  # tool entry -> its run
    paired: dict[str, str] = field(default_factory=dict)  # ChatGPT's result -> call entry
    arbor_results: dict[str, str | None] = field(default_factory=dict)  # -> call id
    arbor_calls: set[str] = field(default_factory=set)

    def walk(self, root: _Entry) -> None:
        stack: list[tuple[str, str | None]] = [(root.id, None)]  # (entry, name to give back)
        while stack:
            node_id, give_back = stack.pop()
            if give_back is not None:  # leaving: the result no longer answers for the path
                run = self.above[node_id]
                assert run is not None
                run.taken[give_back] -= 1
                continue
            entry = self.entries[node_id]
            taken = self._visit(entry)
            if taken is not None:
                stack.append((node_id, taken))
            stack.extend((child, None) for child in reversed(entry.children))

    def _visit(self, entry: _Entry) -> str | None:
        """Place one entry; the tool name whose `taken` count it raised, if it did."""
        parent = self.entries[entry.parent] if entry.parent is not None else None
        lead: _Lead = None  # the run or reply text above, on an unbranched path
        if parent is not None and len(parent.children) == 1:
            lead = self.leads.get(parent.id)
        message = entry.message
        if message is None or not (message.is_call or message.role == "tool"):
            if message is not None and message.kept_role is Role.ASSISTANT:
                self.leads[entry.id] = entry.id  # a call below would be this reply's
            elif message is None or message.kept_role is None:
                self.leads[entry.id] = lead  # skipped: a call below follows what is above
            return None
        if message.is_call:
            self._add_call(entry, message, lead)
            return None
        run: _Run | None = None
        if parent is not None and parent.message is not None:
            if parent.message.role == "tool":
                run = self.above[parent.id]
            elif parent.message.is_call:
                run = self.runs[parent.id]
        self.above[entry.id] = run
        if not message.answers:
            return None
        if message.by_arbor:
            self.arbor_results[entry.id] = message.arbor_id
            return None
        name = message.tool_name
        if run is None or name is None:
            return None
        calls = run.by_name.get(name, [])
        if run.taken[name] >= len(calls):
            return None
        self.paired[entry.id] = calls[run.taken[name]]
        run.taken[name] += 1
        return name

    def _add_call(self, entry: _Entry, message: _Message, lead: _Lead) -> None:
        if isinstance(lead, _Run):
            run = lead
        elif lead is not None:  # the first call after a reply's text
            run = self.runs[lead] = _Run(made=False)
        else:
            run = _Run(made=True)
        self.runs[entry.id] = run
        self.leads[entry.id] = run
        run.calls.append(entry.id)
        if message.by_arbor:
            self.arbor_calls.add(entry.id)
        else:
            run.by_name.setdefault(message.recipient or "", []).append(entry.id)

    def result(self, label: str) -> _Calls:
        """Keep the calls that are answered (or Arbor's); give each call its id."""
        answered = set(self.paired.values()) | self.arbor_calls
        calls: dict[str, ToolCall] = {}
        for run in {id(run): run for run in self.runs.values()}.values():
            run.kept = [call for call in run.calls if call in answered]
            ids: set[str] = set()
            for call in run.kept:
                message = self.entries[call].message
                assert message is not None and message.arguments is not None
                call_id = message.arbor_id if message.arbor_id is not None else call
                if call_id in ids:
                    _fail(f"{label}, node {_short(call)}: its reply makes two tool calls with "
                          f"the id {_short(call_id)}")
                ids.add(call_id)
                calls[call] = ToolCall(call_id, message.recipient or "", message.arguments)
        answers: dict[str, str | None] = dict(self.arbor_results)
        answers.update((result, calls[call].id) for result, call in self.paired.items())
        return _Calls(self.runs, calls, answers)


def _pair_calls(entries: dict[str, _Entry], root: _Entry, label: str) -> _Calls:
    if not any(entry.message is not None and (entry.message.is_call or entry.message.by_arbor)
               for entry in entries.values()):
        return _Calls({}, {}, {})  # no call, no result of Arbor's: no walk (most files)
    pairing = _Pairing(entries)
    pairing.walk(root)
    return pairing.result(label)


def _build_record(
    title: str,
    created: float,
    updated: float,
    entries: dict[str, _Entry],
    order: list[str],
    current: str,
    calls: _Calls,
    tools: list[Any],
) -> ConversationRecord:
    """Keep user/assistant text, calls and their results; hang each kept message under its
    nearest kept ancestor."""
    top = entries[order[0]]
    top_kept = _makes_node(top, calls)
    root_id = _fresh_id(entries) if top_kept else top.id
    anchor: dict[str, str] = {}  # node id -> the record node it is or sits under
    system_texts: list[str] = []
    nodes: list[NodeRecord] = []
    for node_id in order:
        entry = entries[node_id]
        above = root_id if entry.parent is None else anchor[entry.parent]
        message = entry.message
        if message is None or not _makes_node(entry, calls):
            anchor[node_id] = above
            # A system message above every kept message is (part of) the system prompt.
            if above == root_id and message is not None and message.role == "system":
                system_texts.append(message.text or "")
            continue
        anchor[node_id] = node_id
        nodes.append(_node(entry, message, above, calls))
    root = NodeRecord(
        id=root_id,
        parent=None,
        role=Role.SYSTEM,
        text="\n\n".join(text for text in system_texts if text),
        created=top.message.created if top.message is not None and not top_kept else created,
        meta={TOOLS: tools} if tools else {},
    )
    return ConversationRecord(
        title=title,
        nodes=_with_last_active_children([root, *nodes]),
        active_leaf=anchor[current],
        created=created,
        updated=updated,
    )


def _makes_node(entry: _Entry, calls: _Calls) -> bool:
    """Whether an entry becomes a node: kept text, a result, or the first call of a reply
    made for its calls (the other calls join the reply they belong to)."""
    message = entry.message
    if message is None:
        return False
    if entry.id in calls.answers:
        return True
    if calls.kept(entry.id):
        run = calls.runs[entry.id]
        return run.made and run.kept[0] == entry.id
    return message.kept_role is not None and not message.is_call


def _node(entry: _Entry, message: _Message, above: str, calls: _Calls) -> NodeRecord:
    if entry.id in calls.answers:
        call_id = calls.answers[entry.id]
        return NodeRecord(id=entry.id, parent=above, role=Role.TOOL, text=message.text or "",
                          created=message.created,
                          meta={TOOL_CALL_ID: call_id} if call_id is not None else {})
    role = Role.ASSISTANT if calls.kept(entry.id) else message.kept_role
    assert role is not None  # _makes_node said so
    run = calls.runs.get(entry.id)
    meta: dict[str, Any] = {}
    if run is not None and run.kept:
        meta[TOOL_CALLS] = [calls.calls[call].to_meta() for call in run.kept]
    unfinished = message.unfinished and role is Role.ASSISTANT
    return NodeRecord(
        id=entry.id,
        parent=above,
        role=role,
        text="" if calls.kept(entry.id) else message.kept_text,
        created=message.created,
        status=NodeStatus.INTERRUPTED if unfinished else NodeStatus.COMPLETE,
        meta=meta,
    )


def _with_last_active_children(nodes: list[NodeRecord]) -> tuple[NodeRecord, ...]:
    """Point every parent at its newest child, so switching to a branch that is not active
    follows it down to a leaf (the file only says which path is active)."""
    newest: dict[str, tuple[float, int, str]] = {}
    for index, node in enumerate(nodes):
        if node.parent is not None:
            newest[node.parent] = max(
                newest.get(node.parent, (node.created, index, node.id)),
                (node.created, index, node.id),
            )
    return tuple(
        replace(node, last_active_child=newest[node.id][2]) if node.id in newest else node
        for node in nodes
    )


def _fresh_id(entries: dict[str, _Entry]) -> str:
    """An id for a system root added above a mapping whose root is a user message."""
    candidate, number = "root", 0
    while candidate in entries:  # at most len(entries) tries, each on a short string
        number += 1
        candidate = f"root-{number}"
    return candidate


# --- writing -------------------------------------------------------------------------------


def export_chatgpt(records: Sequence[ConversationRecord]) -> bytes:
    """A `conversations.json` holding every branch of every record.

    Ids are UUIDs derived from the record (title, creation time, root id) and each node id,
    so exporting the same records twice gives the same bytes.
    """
    return dumps_strict([_export_conversation(record) for record in records])


def _export_conversation(record: ConversationRecord) -> dict[str, Any]:
    check_record(record)
    space = uuid.uuid5(_EXPORT_NAMESPACE, ascii((record.title, record.created, record.root.id)))

    def new_id(key: str | tuple[str, int]) -> str:
        # ascii() of a node id never equals "\0root", nor that of a (node id, call) pair
        return str(uuid.uuid5(space, ascii(key)))

    top = str(uuid.uuid5(space, "\0root"))
    mapping: dict[str, dict[str, Any]] = {top: _mapping_node(top, None, None)}
    anchor = {record.root.id: top}  # node id -> the message its children hang under
    if record.root.text:
        system_id = new_id(record.root.id)
        _attach(mapping, system_id, top, _message(system_id, record.root, "system"))
        anchor[record.root.id] = system_id
    by_id = {node.id: node for node in record.nodes}
    kids = Counter(node.parent for node in record.nodes)
    names: dict[str, dict[str, str]] = {}  # reply or result -> its reply's tools by call id
    for node in _pre_order(record)[1:]:
        parent = anchor[node.parent] if node.parent is not None else top
        calls = calls_of(node.meta) if node.role is Role.ASSISTANT else ()
        if node.role is Role.TOOL:
            run = names.get(node.parent or "")
            call_id = node.meta.get(TOOL_CALL_ID)
            call_id = call_id if isinstance(call_id, str) else None
            name = run.get(call_id) if run is not None and call_id is not None else None
            message = _tool_message(new_id(node.id), node, name, call_id)
            _attach(mapping, message["id"], parent, message)
            anchor[node.id] = message["id"]
            if run is not None:
                names[node.id] = run
            continue
        if not calls:
            message = _message(new_id(node.id), node, node.role.value)
            _attach(mapping, message["id"], parent, message)
            anchor[node.id] = message["id"]
            continue
        # The text is left out when empty, unless the calls would then follow an assistant
        # message of which they hang alone: they would be read as that reply's.
        above = by_id[node.parent] if node.parent is not None else record.root
        first = True
        if node.text or (above.role is Role.ASSISTANT and kids[above.id] == 1):
            message = _message(new_id(node.id), node, "assistant")
            _attach(mapping, message["id"], parent, message)
            parent, first = message["id"], False
        for index, call in enumerate(calls):
            message = _call_message(new_id((node.id, index)), node, call, first)
            _attach(mapping, message["id"], parent, message)
            parent, first = message["id"], False
        anchor[node.id] = parent
        names[node.id] = {call.id: call.name for call in calls}
    conversation_id = str(space)
    conversation: dict[str, Any] = {
        "title": record.title,
        "create_time": _written_time(record.created),
        "update_time": _written_time(record.updated),
        "mapping": mapping,
        "moderation_results": [],
        "current_node": anchor[record.active_leaf],
        "plugin_ids": None,
        "conversation_id": conversation_id,
        "id": conversation_id,
    }
    tools = tools_of(record.root.meta)
    if tools:
        conversation[ARBOR_TOOLS] = tools
    return conversation


def _pre_order(record: ConversationRecord) -> list[NodeRecord]:
    """Nodes parents first; siblings in Arbor's order (creation time, then record order)."""
    order = {node.id: index for index, node in enumerate(record.nodes)}
    children: dict[str, list[NodeRecord]] = {}
    for node in record.nodes:
        if node.parent is not None:
            children.setdefault(node.parent, []).append(node)
    out: list[NodeRecord] = []
    stack = [record.root]
    while stack:
        node = stack.pop()
        out.append(node)
        kids = sorted(children.get(node.id, []), key=lambda n: (n.created, order[n.id]))
        stack.extend(reversed(kids))
    return out


def _attach(
    mapping: dict[str, dict[str, Any]], node_id: str, parent: str, message: dict[str, Any]
) -> None:
    mapping[node_id] = _mapping_node(node_id, message, parent)
    mapping[parent]["children"].append(node_id)


def _mapping_node(
    node_id: str, message: dict[str, Any] | None, parent: str | None
) -> dict[str, Any]:
    return {"id": node_id, "message": message, "parent": parent, "children": []}


def _message(node_id: str, node: NodeRecord, role: str) -> dict[str, Any]:
    unfinished = node.status is not NodeStatus.COMPLETE
    return {
        "id": node_id,
        "author": {"role": role, "name": None, "metadata": {}},
        "create_time": _written_time(node.created),
        "update_time": None,
        "content": {"content_type": "text", "parts": [node.text]},
        "status": "finished_partial_completion" if unfinished else "finished_successfully",
        "end_turn": None,
        "weight": 1.0,
        "metadata": {},
        "recipient": "all",
    }


def _call_message(node_id: str, node: NodeRecord, call: ToolCall, first: bool) -> dict[str, Any]:
    """A call as ChatGPT writes one: addressed to the tool, the arguments as JSON code. The
    first message written for a reply carries its status."""
    message = _message(node_id, node, "assistant")
    if not first:
        message["status"] = "finished_successfully"
    message.update(
        content={"content_type": "code", "language": "json", "response_format_name": None,
                 "text": call.arguments},
        end_turn=False,
        metadata={ARBOR_CALL_ID: call.id},
        recipient=call.name,
    )
    return message


def _tool_message(
    node_id: str, node: NodeRecord, name: str | None, call_id: str | None
) -> dict[str, Any]:
    """A result as ChatGPT writes one: from the tool, by name (None: a call not found)."""
    message = _message(node_id, node, "tool")
    message["author"]["name"] = name
    message["metadata"] = {ARBOR_CALL_ID: call_id}
    return message


def _written_time(value: float) -> float | None:
    """A time as the importer accepts it; absurd ones (never made by Arbor) become null."""
    return value if 0.0 <= value <= MAX_TIMESTAMP else None


# --- checking values -----------------------------------------------------------------------


def _fail(message: str) -> NoReturn:
    raise FormatError(message)


def _kind(value: Any) -> str:
    """How a JSON value is described in an error message."""
    return "missing" if value is _MISSING else describe(value)


def _require_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(f"{where} must be an object, but is {_kind(value)}")
    return value


def _require_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        _fail(f"{where} must be an array, but is {_kind(value)}")
    return value


def _require_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        _fail(f"{where} must be a string, but is {_kind(value)}")
    return value


def _optional_str(value: Any, where: str) -> str | None:
    return None if value is None else _require_str(value, where)


def _time(value: Any, where: str) -> float:
    """Seconds since 1970; null (or absent) is 0.0. Non-numbers and absurd times are rejected."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        _fail(f"{where} must be a number or null, but is {_kind(value)}")
    if not 0.0 <= value <= MAX_TIMESTAMP:
        _fail(f"{where} is {value}, which is not a time between 1970 and 3000")
    return float(value)


def _short(text: str, limit: int = 40) -> str:
    """A one-line quotation of `text` for an error message."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


__all__ = ["MAX_CONVERSATIONS", "export_chatgpt", "parse_chatgpt"]
