"""ChatGPT `conversations.json`: export every branch of every conversation.

Export writes a reply that calls tools as its text, an ordinary message (left out when
empty, unless the reply is the only child of an assistant reply, whose calls they would be
read as), then each call as an assistant message of `recipient` = the tool's name and
`content: {"content_type": "code", "language": "json", "text": <arguments>}`, one below the
other; a tool node as a message of `author: {"role": "tool", "name": <the tool>}`. Calls and
results carry Arbor's marks (`chatgpt_calls`), so the import reads back the same calls,
results and tools.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

from engine.core.records import ConversationRecord, NodeRecord
from engine.core.tools import TOOL_CALL_ID, ToolCall, calls_of, tools_of
from engine.core.tree import NodeStatus, Role
from engine.files.strict_json import dumps_strict
from engine.storage.formats import check_record
from engine.storage.formats.chatgpt_mapping import ARBOR_CALL_ID, ARBOR_TOOLS, MAX_TIMESTAMP

_EXPORT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://arbor.invalid/formats/chatgpt")


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


__all__ = ["export_chatgpt"]
