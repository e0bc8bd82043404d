"""ChatGPT `conversations.json`: import every branch of every conversation.

What becomes of the messages:
- user and assistant messages with text become nodes (string parts joined with "\\n",
  non-string parts such as images dropped);
- system messages above the first user/assistant message become the system prompt (the
  hidden one ChatGPT puts at the top usually has no text, giving an empty prompt);
- a message with text whose role is none of ChatGPT's (system, user, assistant, tool) becomes
  a user message whose text starts with its role in brackets: kept visibly, never dropped;
- tool calls and their results, as `chatgpt_calls` describes;
- everything else is skipped and its children re-parented to its nearest kept ancestor:
  unanswered calls, tool messages that answer no call, messages hidden from the conversation,
  messages without text (code, browsing, reasoning...), and system messages further down. A
  `current_node` on a skipped message moves to that ancestor.

The file's shapes and their checks are `chatgpt_mapping`'s; here, the conversations are
parsed one at a time and the count limit is checked as they come, so memory holds the decoded
text, one conversation's JSON and the records made so far.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from engine.core.records import ConversationRecord, NodeRecord
from engine.core.tools import TOOL_CALL_ID, TOOL_CALLS, TOOLS
from engine.core.tree import NodeStatus, Role
from engine.files.strict_json import NotAnArrayError, iter_array_strict
from engine.storage.formats import check_record
from engine.storage.formats.chatgpt_calls import Calls, pair_calls
from engine.storage.formats.chatgpt_mapping import (
    ARBOR_TOOLS,
    MISSING,
    Entry,
    Message,
    check_links,
    fail,
    optional_str,
    parse_mapping,
    parse_time,
    require_dict,
    require_list,
    require_str,
    short,
    tree_order,
)

log = logging.getLogger(__name__)

MAX_CONVERSATIONS = 10_000


def parse_chatgpt(data: bytes, *, max_bytes: int = 256 << 20) -> list[ConversationRecord]:
    """Every conversation of a ChatGPT export, all branches kept; FormatError if malformed."""
    records: list[ConversationRecord] = []
    try:
        for raw in iter_array_strict(data, max_bytes=max_bytes):
            if len(records) == MAX_CONVERSATIONS:
                fail(f"the file holds more than {MAX_CONVERSATIONS} conversations; the limit "
                      f"is {MAX_CONVERSATIONS}")
            records.append(_parse_conversation(raw, len(records) + 1))
    except NotAnArrayError as error:
        fail(f"a ChatGPT export is a JSON array of conversations, but this file holds "
              f"{error.kind}")
    return records


def _parse_conversation(raw: Any, number: int) -> ConversationRecord:
    label = f"conversation {number}"
    conversation = require_dict(raw, label)
    title = optional_str(conversation.get("title"), f"{label}: title")
    title = title if title is not None and title.strip() else "Untitled"
    label = f"conversation {number} ({short(title)})"
    created = parse_time(conversation.get("create_time"), f"{label}: create_time")
    updated = parse_time(conversation.get("update_time"), f"{label}: update_time")
    tools = _parse_tools(conversation.get(ARBOR_TOOLS), f"{label}: {ARBOR_TOOLS}")
    entries = parse_mapping(conversation.get("mapping", MISSING), label)
    root = check_links(entries, label)
    order = tree_order(entries, root, label)
    current = require_str(conversation.get("current_node", MISSING), f"{label}: current_node")
    if current not in entries:
        fail(f"{label}: current_node {short(current)} is not in the mapping")
    calls = pair_calls(entries, root, label)
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
    tools = require_list(raw, where)
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            fail(f"{where} must be a list of function tools, each with a name")
    return tools


def _build_record(
    title: str,
    created: float,
    updated: float,
    entries: dict[str, Entry],
    order: list[str],
    current: str,
    calls: Calls,
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


def _makes_node(entry: Entry, calls: Calls) -> bool:
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


def _node(entry: Entry, message: Message, above: str, calls: Calls) -> NodeRecord:
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


def _fresh_id(entries: dict[str, Entry]) -> str:
    """An id for a system root added above a mapping whose root is a user message."""
    candidate, number = "root", 0
    while candidate in entries:  # at most len(entries) tries, each on a short string
        number += 1
        candidate = f"root-{number}"
    return candidate


__all__ = ["MAX_CONVERSATIONS", "parse_chatgpt"]
