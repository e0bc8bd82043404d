"""Tool calling in the tree: what a conversation offers the model, the calls a reply makes,
and the results that answer them, as node meta (the families' call formats are in
engine.core.call_formats).

A conversation's tools live on its root (`TOOLS`: OpenAI's list of function tools); a reply
that calls tools keeps them under `TOOL_CALLS` (its text is what it said besides); a `tool`
node answers one call (`TOOL_CALL_ID`). The chat template renders all three (Hugging Face's
conventions: `tools=`, `message.tool_calls` with arguments as an object, `role: tool`), so an
edit of a result, a retry of a call or a switch between results is a branch like any other.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.core.tree import Node

TOOLS = "tools"  # root meta: the tools offered, OpenAI's shape
TOOL_CALLS = "tool_calls"  # reply meta: the calls it made
TOOL_CALL_ID = "tool_call_id"  # tool node meta: the call it answers
TOOL_SERVERS = "tool_servers"  # root meta in the window: the MCP server of each tool, by name
TOOL_META = (TOOLS, TOOL_CALLS, TOOL_CALL_ID)  # the meta keys the engine must see


def call_id() -> str:
    """A new call's id, as OpenAI's look."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it

    @staticmethod
    def new(name: str, arguments: Mapping[str, Any]) -> ToolCall:
        return ToolCall(call_id(), name, json.dumps(arguments, ensure_ascii=False))

    def to_meta(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @staticmethod
    def from_meta(raw: object) -> ToolCall | None:
        if not isinstance(raw, Mapping):
            return None
        values = raw.get("id"), raw.get("name"), raw.get("arguments")
        if not all(isinstance(v, str) for v in values):
            return None
        return ToolCall(*values)  # type: ignore[arg-type]

    def to_template(self) -> dict[str, Any]:
        """As chat templates read it: OpenAI's shape, arguments as an object."""
        try:
            arguments: Any = json.loads(self.arguments)
        except ValueError:
            arguments = self.arguments
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": arguments}}

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}

    def same_call(self, other: ToolCall) -> bool:
        """The same function with the same arguments (ids aside, JSON spacing aside)."""
        return self.name == other.name and _parsed(self.arguments) == _parsed(other.arguments)


def calls_of(meta: Mapping[str, Any]) -> tuple[ToolCall, ...]:
    raw = meta.get(TOOL_CALLS)
    if not isinstance(raw, list):
        return ()
    calls = [ToolCall.from_meta(item) for item in raw]
    return tuple(c for c in calls if c is not None)


def shown_text(text: str, meta: Mapping[str, Any]) -> str:
    """A message as the chat shows it: a reply's calls after what it said."""
    calls = calls_of(meta)
    lines = [f"`{call.name}({call.arguments})`" for call in calls]
    return "\n\n".join(part for part in (text, *lines) if part)


def call_label(before: Sequence[Node], node: Node) -> str:
    """What a tool node answers, in a few words: `name(arguments)` of the call it answers,
    found in the replies before it on its path (`before`: nodes, nearest last); "" when it
    is not a tool's result or its call is not found."""
    call_id = node.meta.get(TOOL_CALL_ID)
    if not isinstance(call_id, str):
        return ""
    for earlier in reversed(before):
        for call in calls_of(earlier.meta):
            if call.id == call_id:
                arguments = call.arguments if len(call.arguments) <= 60 else (
                    call.arguments[:59] + "…")
                return f"{call.name}({arguments})"
    return ""


def tools_of(meta: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    raw = meta.get(TOOLS)
    return raw if isinstance(raw, list) and raw else None


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(t["function"]["name"]) for t in tools]


def _parsed(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


# --- checking calls ------------------------------------------------------------------------


def valid_call(tools: Sequence[Mapping[str, Any]], name: str, arguments: dict[str, Any]
               ) -> bool:
    """A call of one of `tools` with arguments its JSON schema accepts."""
    import jsonschema  # only when a reply is parsed: the module is read at every start

    for tool in tools:
        function = tool["function"]
        if function["name"] != name:
            continue
        schema = function.get("parameters")
        if not schema:
            return True
        try:
            jsonschema.validate(arguments, schema)
        except jsonschema.ValidationError:
            return False
        except jsonschema.SchemaError:
            return False
        return True
    return False


def valid_parameter(tools: Sequence[Mapping[str, Any]], name: str, key: str, value: Any
                    ) -> bool:
    """Whether the tool `name` of `tools` takes `value` as its parameter `key`, the others
    aside (its schema without `required`): a call's arguments checked one at a time, as
    they are read."""
    import jsonschema

    for tool in tools:
        function = tool["function"]
        if function["name"] != name:
            continue
        schema = function.get("parameters")
        if not isinstance(schema, Mapping) or not schema:
            return True
        try:
            jsonschema.validate({key: value}, {**schema, "required": []})
        except (jsonschema.ValidationError, jsonschema.SchemaError):
            return False
        return True
    return False


def call_schema(tools: Sequence[Mapping[str, Any]], choice: str, key: str = "arguments"
                ) -> dict[str, Any]:
    """The JSON schema of one call the reply must make: of `choice` (a tool's name), or of
    any tool ("required"); `key`: what the family names the arguments (Llama 3:
    "parameters")."""
    options = []
    for tool in tools:
        function = tool["function"]
        if choice not in ("required", function["name"]):
            continue
        options.append({"type": "object",
                        "properties": {"name": {"const": function["name"]},
                                       key: function.get("parameters")
                                       or {"type": "object"}},
                        "required": ["name", key], "additionalProperties": False})
    return options[0] if len(options) == 1 else {"anyOf": options}
