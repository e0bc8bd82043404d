"""The OpenAI chat `messages` list: `{"messages": [{"role": ..., "content": ...}, ...]}`.

It holds one linear conversation, so export writes the active branch and import reads a
chain. Only plain string content and the roles system, user, assistant and tool are accepted;
a system message is allowed only first, where it becomes the system prompt. Tool calls
(`tool_calls` of an assistant message, `tool_call_id` of a tool's, the `tools` offered beside
`messages`) are kept both ways (engine.core.tools).
"""

from __future__ import annotations

from typing import Any

from engine.core.records import MAX_NODES, ConversationRecord, NodeRecord
from engine.core.tools import TOOL_CALL_ID, TOOL_CALLS, TOOLS, ToolCall, calls_of, tools_of
from engine.core.tree import Role
from engine.files.regular import FormatError
from engine.files.strict_json import dumps_strict, loads_strict
from engine.storage.formats import active_path, check_record

_ROLES = {"system": Role.SYSTEM, "user": Role.USER, "assistant": Role.ASSISTANT,
          "tool": Role.TOOL}


def export_openai_messages(record: ConversationRecord) -> bytes:
    """The active branch as `{"messages": [...]}`, the system prompt first when not empty."""
    check_record(record)
    path = active_path(record)
    messages: list[dict[str, Any]] = []
    for node in path[1:]:
        message: dict[str, Any] = {"role": node.role.value, "content": node.text}
        calls = calls_of(node.meta)
        if calls:
            message["tool_calls"] = [call.to_openai() for call in calls]
        if isinstance(node.meta.get(TOOL_CALL_ID), str):
            message["tool_call_id"] = node.meta[TOOL_CALL_ID]
        messages.append(message)
    if path[0].text:
        messages.insert(0, {"role": "system", "content": path[0].text})
    tools = tools_of(path[0].meta)
    return dumps_strict({"messages": messages, **({"tools": tools} if tools else {})})


def parse_openai_messages(
    data: bytes, *, title: str = "Untitled", max_bytes: int = 64 << 20
) -> ConversationRecord:
    """One linear conversation; ids are "0" (root), "1", ...; times are 0.0 (the format has
    none), so the caller stamps them if it cares."""
    top = loads_strict(data, max_bytes=max_bytes)
    if not isinstance(top, dict) or not isinstance(top.get("messages"), list):
        raise FormatError('an OpenAI messages file is a JSON object with a "messages" array')
    raw_messages: list[Any] = top["messages"]
    if len(raw_messages) > MAX_NODES:
        raise FormatError(f"the file has {len(raw_messages)} messages; the limit is {MAX_NODES}")
    parsed = [_parse_message(raw, index) for index, raw in enumerate(raw_messages, start=1)]
    system = ""
    if parsed and parsed[0][0] is Role.SYSTEM:
        system = parsed.pop(0)[1]
    tools = top.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(
            isinstance(t, dict) and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools)):
        raise FormatError('"tools" must be a list of function tools, each with a name')
    nodes = [NodeRecord(id="0", parent=None, role=Role.SYSTEM, text=system, created=0.0,
                        meta={TOOLS: tools} if tools else {})]
    for role, text, meta in parsed:
        if role is Role.SYSTEM:
            raise FormatError("a system message is allowed only as the first message")
        nodes.append(NodeRecord(id=str(len(nodes)), parent=nodes[-1].id, role=role, text=text,
                                created=0.0, meta=meta))
    record = ConversationRecord(title=title, nodes=tuple(nodes), active_leaf=nodes[-1].id)
    check_record(record)
    return record


def _parse_message(raw: Any, index: int) -> tuple[Role, str, dict[str, Any]]:
    where = f"message {index}"
    if not isinstance(raw, dict):
        raise FormatError(f"{where} must be an object")
    role = raw.get("role")
    if not isinstance(role, str):
        raise FormatError(f"{where} must have a string role")
    if role not in _ROLES:
        shown = repr(role if len(role) <= 40 else role[:40] + "...")
        raise FormatError(f"{where} has the role {shown}; only system, user, assistant and tool "
                          f"are read")
    meta: dict[str, Any] = {}
    content = raw.get("content")
    if role == "assistant" and raw.get("tool_calls"):
        calls = raw["tool_calls"]
        made = [ToolCall.from_meta({"id": c.get("id"), **c.get("function", {})})
                if isinstance(c, dict) and isinstance(c.get("function"), dict) else None
                for c in calls] if isinstance(calls, list) else [None]
        if not made or None in made:
            raise FormatError(f"{where} has tool calls without an id, a name and arguments")
        meta[TOOL_CALLS] = [call.to_meta() for call in made if call is not None]
        content = "" if content is None else content
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str):
            raise FormatError(f"{where} is a tool result without the tool_call_id it answers")
        meta[TOOL_CALL_ID] = call_id
    if not isinstance(content, str):
        raise FormatError(f"{where} must have a string content (parts and null are not read)")
    return _ROLES[role], content, meta


__all__ = ["export_openai_messages", "parse_openai_messages"]
