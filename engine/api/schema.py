"""OpenAI chat-completion requests in, OpenAI-shaped answers out, checked before any work.

Only what Arbor does is accepted: a request asking for something it would silently ignore in
a way that changes the answer (`n` > 1, tools, images, a sampler llama.cpp's chain here does not
have) is refused with a 400 that says so. The samplers clients send (`top_k`, `min_p`, the
repetition, frequency and presence penalties, `logit_bias`) and `response_format` (JSON, by a
grammar) are applied.
Fields that change nothing about the text (`metadata`, `store`...) are ignored, as OpenAI's
own server does with unknown keys. `user` names the client's cache scope: requests share
conversation trees and cached state only with requests of the same `user` (absent is one
scope of its own), never with the window's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import jsonschema

from engine.config.params import SamplingParams
from engine.core.attachments import Document
from engine.core.results import TokenLogprob
from engine.core.tools import ToolCall
from engine.core.tree import Role
from engine.files.documents import DocumentError, document_from_bytes
from engine.files.regular import FormatError
from engine.files.strict_json import loads_strict

MAX_BODY_BYTES = 4 << 20
MAX_MESSAGES = 10_000
MAX_STOP = 4  # OpenAI's own limit on stop sequences
MAX_STOP_CHARS = 200
MAX_TOKENS_LIMIT = 1 << 20
MAX_USER_CHARS = 1024
API_SCOPE = "api:"  # + the sha256 of `user`: never "", the window's scope
_ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER,
          "assistant": Role.ASSISTANT, "tool": Role.TOOL}
MAX_TOOLS = 128
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class ApiError(Exception):
    """An answer that is an error: the HTTP status and OpenAI's error object."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass(frozen=True)
class Message:
    role: Role
    text: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant message's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    documents: tuple[Document, ...] = ()  # a user message's attached files (`file` parts)


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat-completion request."""

    model: str
    system: str
    # After the system prompt. The last is the user's, or the assistant's: a reply to go on
    # with (a prefill, SillyTavern's "continue"), whose text the answer does not repeat.
    messages: tuple[Message, ...]
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    user: str = ""  # OpenAI's end-user identifier: the cache scope ("" when not sent)
    # The other samplers the request sets (SamplingParams' field names), response_format's
    # schema among them: `sampling` applies them over the server's defaults.
    samplers: tuple[tuple[str, Any], ...] = ()
    # The tools offered (OpenAI's list, as canonical JSON; "" none, or tool_choice "none").
    tools: str = ""

    def sampling(self, defaults: SamplingParams) -> SamplingParams:
        """The sampling of this request: the server's defaults with what it sets."""
        changes: dict[str, Any] = dict(self.samplers)
        if self.temperature is not None:
            changes["temperature"] = self.temperature
        if self.top_p is not None:
            changes["top_p"] = self.top_p
        return replace(defaults, **changes)

    @property
    def prefill(self) -> bool:
        """The request continues the assistant message it ends with."""
        return self.messages[-1].role is Role.ASSISTANT

    @property
    def scope(self) -> str:
        """The cache scope of this request (engine.storage.checkpoints): one per `user`, none of
        them the window's."""
        return API_SCOPE + hashlib.sha256(self.user.encode("utf-8", "surrogatepass")
                                          ).hexdigest()


def parse_body(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body (413 when too large, 400 when not JSON)."""
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is {len(body):,} bytes; the limit is "
                            f"{MAX_BODY_BYTES:,}", code="request_too_large")
    try:
        value = loads_strict(body, max_bytes=MAX_BODY_BYTES, max_depth=32)
    except FormatError as exc:
        raise bad(str(exc).replace("the file", "the request body", 1)) from None
    if not isinstance(value, dict):
        raise bad("the request body must be a JSON object")
    return value


def parse_chat(raw: dict[str, Any]) -> ChatRequest:
    model = raw.get("model", "")
    if not isinstance(model, str):
        raise bad("'model' must be a string", "model")
    n = raw.get("n", 1)
    if n is not None and (_int(n, "n") != 1):
        raise bad("Arbor answers one choice per request: 'n' must be 1", "n")
    for unsupported in ("functions", "function_call"):
        if raw.get(unsupported) not in (None, False, []):
            raise bad(f"'{unsupported}' is not supported by Arbor's server", unsupported)
    for name, neutral in _OTHER_SAMPLERS.items():
        if raw.get(name) is not None and raw.get(name) != neutral:
            raise bad(f"'{name}' is a sampler Arbor's server does not have: leave it out "
                      f"(or at {neutral})", name)
    stream = _bool(raw.get("stream", False), "stream")
    options = raw.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise bad("'stream_options' must be an object", "stream_options")
        include_usage = _bool(options.get("include_usage", False), "stream_options")
    system, messages = _messages(raw.get("messages"))
    tools, tool_samplers = _tools(raw)
    if messages[-1].role is Role.ASSISTANT and messages[-1].tool_calls:
        raise bad("the last message is an assistant's tool calls: send their results as "
                  "tool messages to be answered", "messages")
    limit = raw.get("max_completion_tokens", raw.get("max_tokens"))
    max_tokens = None
    if limit is not None:
        max_tokens = _int(limit, "max_tokens")
        if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
            raise bad("'max_tokens' must be at least 1", "max_tokens")
    temperature = _number(raw.get("temperature"), "temperature", 0.0, 2.0)
    top_p = _number(raw.get("top_p"), "top_p", 0.0, 1.0)
    seed = raw.get("seed")
    if seed is not None:
        seed = _int(seed, "seed") & 0x7FFFFFFF
    user = raw.get("user")
    if user is None:
        user = ""
    elif not isinstance(user, str) or len(user) > MAX_USER_CHARS:
        raise bad(f"'user' must be a string of at most {MAX_USER_CHARS} characters", "user")
    return ChatRequest(model=model, system=system, messages=messages, stream=stream,
                       include_usage=include_usage, max_tokens=max_tokens,
                       temperature=temperature, top_p=top_p, seed=seed,
                       stop=_stop(raw.get("stop")), user=user,
                       samplers=_samplers(raw) + tool_samplers, tools=tools)


# Samplers clients send that llama.cpp has but Arbor's chain does not apply, each with the
# value that means "off": anything else is refused by name, never silently ignored.
_OTHER_SAMPLERS: dict[str, object] = {
    "typical_p": 1, "tfs": 1, "tfs_z": 1, "top_a": 0, "mirostat": 0, "mirostat_mode": 0,
    "dry_multiplier": 0, "xtc_probability": 0, "top_n_sigma": -1, "smoothing_factor": 0,
    "dynatemp_range": 0,
}
MAX_LOGIT_BIAS = 1024
MAX_TOP_LOGPROBS = 20  # OpenAI's own limit  # entries, as many as a client could mean


def _samplers(raw: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The SamplingParams changes a request asks for: the samplers SillyTavern, Open WebUI
    and llama-server's clients send, by their names there, and response_format."""
    out: dict[str, Any] = {}
    top_k = raw.get("top_k")
    if top_k is not None:
        out["top_k"] = _int(top_k, "top_k")
        if not 0 <= out["top_k"] <= 1 << 20:
            raise bad("'top_k' must be between 0 (off) and 1048576", "top_k")
    for name, low, high in (("min_p", 0.0, 1.0), ("frequency_penalty", -2.0, 2.0),
                            ("presence_penalty", -2.0, 2.0)):
        value = _number(raw.get(name), name, low, high)
        if value is not None:
            out[name] = value
    for name in ("repetition_penalty", "repeat_penalty"):  # SillyTavern's, llama-server's
        value = _number(raw.get(name), name, 0.0, 10.0)
        if value is not None:
            if value <= 0.0:
                raise bad(f"'{name}' must be above 0 (1 is off)", name)
            out["repeat_penalty"] = value
    for name in ("repetition_penalty_range", "repeat_last_n"):
        value = raw.get(name)
        if value is not None:
            out["penalty_last_n"] = _int(value, name)
            if not 0 <= out["penalty_last_n"] <= MAX_TOKENS_LIMIT:
                raise bad(f"'{name}' must be a count of tokens, 0 or more", name)
    wanted = raw.get("logprobs") is not None and _bool(raw["logprobs"], "logprobs")
    top = raw.get("top_logprobs")
    if top is not None:
        if not wanted:
            raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        if not 0 <= _int(top, "top_logprobs") <= MAX_TOP_LOGPROBS:
            raise bad(f"'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS}",
                      "top_logprobs")
    if wanted:
        out["top_logprobs"] = top or 0
    bias = raw.get("logit_bias")
    if bias is not None:
        out["logit_bias"] = _logit_bias(bias)
    schema = _response_schema(raw.get("response_format"))
    if schema is not None:
        out["json_schema"] = schema
    return tuple(out.items())


def _logit_bias(raw: object) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias from -100 to 100}."""
    if not isinstance(raw, dict):
        raise bad("'logit_bias' must be an object of token ids and biases", "logit_bias")
    if len(raw) > MAX_LOGIT_BIAS:
        raise bad(f"at most {MAX_LOGIT_BIAS} entries in 'logit_bias'", "logit_bias")
    out: list[tuple[int, float]] = []
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9):
            raise bad("'logit_bias' keys must be token ids", "logit_bias")
        bias = _number(value, "logit_bias", -100.0, 100.0)
        assert bias is not None
        out.append((int(key), bias))
    return tuple(sorted(out))


def _response_schema(raw: object) -> str | None:
    """The JSON schema (as JSON text) response_format asks for; None for plain text."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind != "json_schema":
        raise bad("'response_format' must be of type text, json_object or json_schema",
                  "response_format")
    assert isinstance(raw, dict)
    spec = raw.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise bad("'response_format.json_schema.schema' must be a JSON schema object",
                  "response_format")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise bad(f"'response_format' holds an invalid JSON schema: {exc.message}",
                  "response_format") from None
    return json.dumps(schema, sort_keys=True)


def _tools(raw: dict[str, Any]) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """The tools offered (canonical JSON, "" for none) and the sampling they ask for
    (tool_choice, parallel_tool_calls)."""
    tools = raw.get("tools")
    choice = raw.get("tool_choice")
    parallel = raw.get("parallel_tool_calls")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise bad("'tool_choice' asks for a tool, but the request offers none",
                      "tool_choice")
        return "", ()
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad(f"'tools' must be a list of at most {MAX_TOOLS} function tools", "tools")
    offered: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" \
                or not isinstance(function, dict):
            raise bad(f"tools[{index}] must be {{'type': 'function', 'function': {{...}}}}",
                      "tools")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise bad(f"tools[{index}] needs a name of letters, digits, '_', '.' or '-' "
                      f"(at most 64)", "tools")
        description = function.get("description", "")
        if not isinstance(description, str):
            raise bad(f"tools[{index}]: 'description' must be a string", "tools")
        parameters = function.get("parameters")
        entry: dict[str, Any] = {"name": name}
        if description:
            entry["description"] = description
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise bad(f"tools[{index}]: 'parameters' must be a JSON schema object", "tools")
            try:
                jsonschema.validators.validator_for(parameters).check_schema(parameters)
            except jsonschema.SchemaError as exc:
                raise bad(f"tools[{index}]: 'parameters' is not a valid JSON schema: "
                          f"{exc.message}", "tools") from None
            entry["parameters"] = parameters
        offered.append({"type": "function", "function": entry})
    names = [t["function"]["name"] for t in offered]
    if len(set(names)) != len(names):
        raise bad("two tools have the same name", "tools")
    if choice is None or choice == "auto":
        picked = "auto"
    elif choice == "none":
        return "", ()  # offered none: the model writes text
    elif choice == "required":
        picked = "required"
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict) \
            and choice["function"].get("name") in names:
        picked = choice["function"]["name"]
    else:
        raise bad("'tool_choice' must be none, auto, required or "
                  "{'type': 'function', 'function': {'name': one of the tools}}", "tool_choice")
    samplers: list[tuple[str, Any]] = [("tool_choice", picked)]
    if parallel is not None:
        samplers.append(("parallel_tool_calls", _bool(parallel, "parallel_tool_calls")))
    return json.dumps(offered, sort_keys=True, ensure_ascii=False), tuple(samplers)


def _tool_calls(raw: object, where: str) -> tuple[ToolCall, ...]:
    if raw is None or raw == []:
        return ()
    if not isinstance(raw, list):
        raise bad(f"{where}: 'tool_calls' must be a list", "messages")
    calls: list[ToolCall] = []
    for item in raw:
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(item.get("id"), str) \
                or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments"), str):
            raise bad(f"{where}: each tool call needs an 'id' and a 'function' with a 'name' "
                      f"and 'arguments' (a JSON string)", "messages")
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise bad(f"{where}: a tool call's 'arguments' must be a JSON object, as text",
                      "messages")
        calls.append(ToolCall(item["id"], function["name"], function["arguments"]))
    return tuple(calls)


def _messages(raw: object) -> tuple[str, tuple[Message, ...]]:
    if not isinstance(raw, list) or not raw:
        raise bad("'messages' must be a non-empty list", "messages")
    if len(raw) > MAX_MESSAGES:
        raise bad(f"at most {MAX_MESSAGES:,} messages per request", "messages")
    out: list[Message] = []
    for index, item in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(item, dict):
            raise bad(f"{where} must be an object", "messages")
        name = item.get("role")
        role = _ROLES.get(name) if isinstance(name, str) else None
        if role is None:
            shown = name[:40] if isinstance(name, str) else type(name).__name__
            raise bad(f"{where} has the role {shown!r}; Arbor knows system, developer, user, "
                      f"assistant and tool", "messages")
        if role is Role.ASSISTANT and item.get("tool_calls"):
            content = item.get("content")
            calls = _tool_calls(item.get("tool_calls"), where)
            out.append(Message(role, "" if content is None else _content(content, where),
                               tool_calls=calls))
        elif role is Role.TOOL:
            call_id = item.get("tool_call_id")
            if not isinstance(call_id, str):
                raise bad(f"{where}: a tool message needs the 'tool_call_id' it answers",
                          "messages")
            out.append(Message(role, _content(item.get("content"), where),
                               tool_call_id=call_id))
        elif role is Role.USER:
            text, documents = _user_content(item.get("content"), where)
            out.append(Message(role, text, documents=documents))
        else:
            out.append(Message(role, _content(item.get("content"), where)))
    system = ""
    if out[0].role is Role.SYSTEM:
        system = out.pop(0).text
    if any(m.role is Role.SYSTEM for m in out):
        raise bad("a system message may only come first", "messages")
    if out and out[-1].role is Role.ASSISTANT and not out[-1].text and not out[-1].tool_calls:
        out.pop()  # an empty reply to continue: a new reply
    if not out or out[-1].role is Role.SYSTEM:
        raise bad("the last message must be the user's or a tool's (Arbor answers it) or the "
                  "assistant's (Arbor continues it)", "messages")
    for index, message in enumerate(out):
        if message.role is Role.TOOL and not (index and out[index - 1].role in (
                Role.TOOL, Role.ASSISTANT) and _answers(out[:index], message.tool_call_id)):
            raise bad("a tool message must follow the assistant message whose call it "
                      "answers (by its 'tool_call_id')", "messages")
    if out[-1].role is Role.ASSISTANT and (len(out) < 2 or out[-2].role is not Role.USER):
        raise bad("an assistant message to continue must follow a user message", "messages")
    return system, tuple(out)


def _answers(before: list[Message], call_id: str | None) -> bool:
    """Whether the assistant message before these tool messages made the call `call_id`."""
    for message in reversed(before):
        if message.role is Role.ASSISTANT:
            return any(call.id == call_id for call in message.tool_calls)
    return False


def _content(raw: object, where: str) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):  # content parts: text only
        texts: list[str] = []
        for part in raw:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise bad(f"{where}: only text content parts are supported", "messages")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"{where} needs a string 'content'", "messages")


def _user_content(raw: object, where: str) -> tuple[str, tuple[Document, ...]]:
    """A user message's text and its attached files: OpenAI's `file` parts, each
    `{"filename": ..., "file_data": "data:<type>;base64,..."}`, read as documents are in the
    window (engine.files.documents). Parsing a PDF blocks: the server parses requests off
    its event loop."""
    if not isinstance(raw, list):
        return _content(raw, where), ()
    texts: list[str] = []
    documents: list[Document] = []
    for index, part in enumerate(raw):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "file":
            documents.append(_file_part(part.get("file"), f"{where}.content[{index}]"))
        elif kind in ("image_url", "input_image"):
            raise bad(f"{where}: images are not supported by this server yet", "messages")
        else:
            texts.append(_content([part], where))
    return "".join(texts), tuple(documents)


def _file_part(raw: object, where: str) -> Document:
    if not isinstance(raw, dict):
        raise bad(f"{where} needs a 'file' object", "messages")
    if "file_id" in raw and "file_data" not in raw:
        raise bad(f"{where}: Arbor keeps no uploaded files; send the file itself as "
                  f"'file_data' (a data: URL)", "messages")
    name, data = raw.get("filename"), raw.get("file_data")
    if not isinstance(name, str) or not name:
        raise bad(f"{where} needs a 'filename'", "messages")
    if not isinstance(data, str):
        raise bad(f"{where} needs 'file_data': a data: URL of the file", "messages")
    match = re.fullmatch(r"data:[\w.+/-]*(?:;[\w=.-]+)*;base64,([A-Za-z0-9+/=\s]*)", data,
                         re.ASCII)
    if match is None:
        raise bad(f"{where}: 'file_data' must be a base64 data: URL "
                  f"(data:application/pdf;base64,...); Arbor fetches no remote file",
                  "messages")
    try:
        content = base64.b64decode(match.group(1), validate=False)
    except (binascii.Error, ValueError):
        raise bad(f"{where}: 'file_data' is not valid base64", "messages") from None
    try:
        return document_from_bytes(name, content)
    except DocumentError as exc:
        raise bad(f"{where}: {exc}", "messages") from None


def _stop(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise bad("'stop' must be a non-empty string or a list of them", "stop")
    if len(items) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in items):
        raise bad(f"at most {MAX_STOP} stop sequences of {MAX_STOP_CHARS} characters", "stop")
    return tuple(items)


def _bool(value: object, param: str) -> bool:
    if not isinstance(value, bool):
        raise bad(f"'{param}' must be true or false", param)
    return value


def _int(value: object, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'{param}' must be an integer", param)
    return value


def _number(value: object, param: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad(f"'{param}' must be a number", param)
    if not low <= value <= high:
        raise bad(f"'{param}' must be between {low:g} and {high:g}", param)
    return float(value)


# --- answers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens restored from the cache or a checkpoint, not decoded

    def body(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def logprobs_body(logprobs: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
    """OpenAI's `logprobs` of a choice: None when not asked for."""
    return None if logprobs is None else {"content": [t.body() for t in logprobs]}


def completion(ident: str, model: str, text: str, finish: str, usage: Usage,
               calls: tuple[ToolCall, ...] = (),
               logprobs: Sequence[TokenLogprob] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["content"] = text or None
        message["tool_calls"] = [call.to_openai() for call in calls]
    return {"id": ident, "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": finish, "logprobs": logprobs_body(logprobs)}],
            "usage": usage.body()}


def chunk(ident: str, model: str, *, delta: dict[str, Any] | None = None,
          finish: str | None = None, usage: Usage | None = None,
          choices: bool = True, logprobs: Sequence[TokenLogprob] | None = None
          ) -> dict[str, Any]:
    """One streamed chunk; the usage chunk (include_usage) has no choices."""
    body: dict[str, Any] = {"id": ident, "object": "chat.completion.chunk",
                            "created": int(time.time()), "model": model,
                            "choices": [{"index": 0, "delta": delta or {},
                                         "finish_reason": finish,
                                         "logprobs": logprobs_body(logprobs)}]
                            if choices else []}
    if usage is not None:
        body["usage"] = usage.body()
    return body
