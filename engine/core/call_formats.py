"""How model families write tool calls, found from their chat templates' markers: reading a
reply's calls, writing calls as the model would, and the grammar of a call.

Three syntaxes cover the families known here:

* JSON objects `{"name": ..., "arguments": {...}}` after a marker: Hermes and Qwen 2.5/3
  (`<tool_call>…</tool_call>`), Mistral (`[TOOL_CALLS][…]`), Llama 3.x (a bare object, or
  `<|python_tag|>` and one). Their grammar is built from the tools' JSON schemas by llama.cpp's
  converter (engine.llm.llama), so a call is valid JSON by construction.
* XML, as Qwen3-Coder writes it and Qwen 3.5, Nemotron 3 Nano and Step 3.5 took up:
  `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`,
  a string value raw, others as JSON.
* Python-like calls, as LFM2 writes them: `<|tool_call_start|>[name(p="v", q=1)]<|tool_call_end|>`.

The grammars of the last two are written here (`ToolFormat.grammar`): they fix the structure
and the names (functions and their parameters), not the values' types, which the schema check
of a finished call (engine.core.tools.valid_call) decides. A call that does not parse, names
an unknown tool or fails its schema stays in the reply's text as the model wrote it: never a
call the model did not make.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

Call = tuple[str, dict[str, Any]]  # a tool's name and its arguments
Accept = Callable[[str, dict[str, Any]], bool]


class Syntax(StrEnum):
    JSON = "json"  # {name, arguments} objects
    NAMED_JSON = "named-json"  # a name, then its arguments' object (Mistral's newer)
    XML = "xml"
    PYTHONIC = "pythonic"


@dataclass(frozen=True)
class ToolFormat:
    """How a model family writes a call, found from its chat template's markers."""

    name: str
    marker: str  # the text a reply's calls begin with
    prefix: str  # what a forced call starts with (before the call's body)
    suffix: str  # and ends with
    at_open: bool = False  # a reply that opens with a JSON object is a call too
    joiner: str = ""  # between the calls after one marker ("" : a marker per call)
    syntax: Syntax = Syntax.JSON
    end: str = ""  # the text that closes the calls after a marker (shown like the marker)
    inner: tuple[str, ...] = ()  # other markers inside a call
    key: str = "arguments"  # what a JSON call names its arguments

    @property
    def shown(self) -> tuple[str, ...]:
        """The format's markers, which a reply's text must show even where the vocabulary
        holds them as special tokens (which llama.cpp leaves out of a reply's text)."""
        return tuple(m for m in (self.marker, self.end, *self.inner) if m)

    def parse(self, text: str, accept: Accept) -> tuple[str, list[Call]]:
        """(what the reply said besides, the calls) of a reply's text. A call whose body
        does not parse, that is not {name, arguments}, or that `accept` refuses (an unknown
        tool, arguments its schema rejects) is left in the text as the model wrote it."""
        match self.name:
            case "hermes":
                return _parse_hermes(text, accept)
            case "mistral":
                return _parse_mistral(text, accept)
            case "mistral-args":
                return _parse_mistral_args(text, accept)
            case "qwen-xml":
                return _parse_xml(text, accept)
            case "lfm2":
                return _parse_pythonic(text, accept)
            case _:
                return _parse_llama3(text, accept)

    def render(self, calls: Sequence[Call]) -> str:
        """The text of `calls` as the model writes them."""
        match self.syntax:
            case Syntax.NAMED_JSON:
                return "".join(f"{self.marker}{name}[ARGS]"
                               f"{json.dumps(arguments, ensure_ascii=False)}"
                               for name, arguments in calls)
            case Syntax.XML:
                return "\n".join(f"{self.prefix}{_xml_call(name, arguments)}{self.suffix}"
                                 for name, arguments in calls)
            case Syntax.PYTHONIC:
                return (self.prefix + self.joiner.join(
                    f"{name}({', '.join(f'{k}={_py_literal(v)}' for k, v in args.items())})"
                    for name, args in calls) + self.suffix)
        bodies = [json.dumps({"name": name, self.key: arguments}, ensure_ascii=False)
                  for name, arguments in calls]
        if self.joiner:
            return self.prefix + self.joiner.join(bodies) + self.suffix
        return "".join(f"{self.prefix}{body}{self.suffix}" for body in bodies)

    def grammar(self, tools: Sequence[Mapping[str, Any]], choice: str, *, lazy: bool) -> str:
        """The GBNF grammar (rooted at `root`) of one call of `choice` (a tool's name, or
        "required": any) in an XML or Python-like format: from the reply's start, or (`lazy`)
        from just after the marker. JSON formats take their grammar from the schemas
        (engine.llm.llama.call_grammar)."""
        functions = [t["function"] for t in tools
                     if choice in ("required", t["function"]["name"])]
        if not functions:
            raise ValueError(f"no tool named {choice!r}")
        if self.syntax is Syntax.NAMED_JSON:
            return _named_json_grammar(functions, "" if lazy else self.marker)
        if self.syntax is Syntax.XML:
            return _xml_grammar(functions, "" if lazy else self.marker)
        if self.syntax is Syntax.PYTHONIC:
            return _pythonic_grammar(functions, "" if lazy else self.marker,
                                     self.prefix.removeprefix(self.marker),
                                     self.suffix, self.joiner)
        raise ValueError(f"the {self.name} format's grammar comes from its JSON schemas")


HERMES = ToolFormat("hermes", "<tool_call>", "<tool_call>\n", "\n</tool_call>",
                    end="</tool_call>")
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "[TOOL_CALLS][", "]", joiner=",")
# Mistral's newer templates (Small 3.2, Devstral, Ministral 3): `[TOOL_CALLS]name[ARGS]{…}`,
# with `[CALL_ID]id` before `[ARGS]` in some; each call has its own marker.
MISTRAL_ARGS = ToolFormat("mistral-args", "[TOOL_CALLS]", "[TOOL_CALLS]", "",
                          syntax=Syntax.NAMED_JSON, inner=("[ARGS]", "[CALL_ID]"))
LLAMA3 = ToolFormat("llama3", "<|python_tag|>", "", "", at_open=True, key="parameters")
QWEN_XML = ToolFormat("qwen-xml", "<tool_call>", "<tool_call>\n", "\n</tool_call>",
                      syntax=Syntax.XML, end="</tool_call>")
LFM2 = ToolFormat("lfm2", "<|tool_call_start|>", "<|tool_call_start|>[", "]<|tool_call_end|>",
                  joiner=", ", syntax=Syntax.PYTHONIC, end="<|tool_call_end|>")
FORMATS = (HERMES, MISTRAL, MISTRAL_ARGS, LLAMA3, QWEN_XML, LFM2)


class ToolSupport(Exception):
    """The model's chat template cannot take tools (or writes calls in a way not known)."""


def tool_format(template_source: str | None) -> ToolFormat:
    """The call format of a Jinja chat template (None: one of llama.cpp's built-in ones,
    which take no tools). Raises ToolSupport saying why when it has none. The markers
    checked are those llama.cpp's own chat code keys its formats on (common/chat.cpp)."""
    if template_source is None or "tools" not in template_source:
        raise ToolSupport("this model's chat template takes no tools: it cannot call them")
    src = template_source
    if "<|tool_list_start|>" in src or "List of tools: [" in src:
        return LFM2
    if "<tool_call>" in src and "<function=" in src and "<parameter=" in src:
        return QWEN_XML
    other = any(tag in src for tag in _OTHER_TAGGED)
    if "<tool_call>" in src and not other:
        return HERMES
    if "[TOOL_CALLS]" in src:
        return MISTRAL_ARGS if "[ARGS]" in src else MISTRAL
    if ("<|python_tag|>" in src or "ipython" in src) and not other:
        return LLAMA3
    raise ToolSupport("this model's chat template takes tools, but writes calls in a way "
                      "Arbor does not read (it knows Hermes/Qwen, Qwen3-Coder XML, Llama 3, "
                      "Mistral and LFM2 calls)")


def known_format(template_source: str | None) -> ToolFormat | None:
    """`tool_format`, or None where the template takes no tools Arbor can read."""
    try:
        return tool_format(template_source)
    except ToolSupport:
        return None


# Templates that write calls in other ways while holding a marker of the formats above: GLM
# and Ling (<arg_key>/<arg_value> pairs), MiniMax (<invoke name=…>, <tool_calls> lines),
# MiniCPM (<function name=…>), Apriel (<tool_calls>[…]), Functionary 3.1 (<function=…>{…}),
# gpt-oss (harmony's channels).
_OTHER_TAGGED = ("<arg_key>", "<invoke name=", "<function name=", "<tool_calls>",
                 "<function=' + ", "<|channel|>")


# --- reading ----------------------------------------------------------------------------------


def _parsed(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call_of(value: object, accept: Accept) -> Call | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _parsed(arguments)
    if not isinstance(arguments, dict) or not accept(value["name"], arguments):
        return None
    return value["name"], arguments


_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _parse_tagged(text: str, pattern: re.Pattern[str], read: Callable[[str], Call | None]
                  ) -> tuple[str, list[Call]]:
    calls: list[Call] = []
    kept: list[str] = []
    pos = 0
    for found in pattern.finditer(text):
        call = read(found.group(1))
        if call is None:
            continue
        kept.append(text[pos:found.start()])
        pos = found.end()
        calls.append(call)
    kept.append(text[pos:])
    return "".join(kept).strip() if calls else text, calls


def _parse_hermes(text: str, accept: Accept) -> tuple[str, list[Call]]:
    return _parse_tagged(text, _HERMES_CALL, lambda body: _call_of(_loads(body), accept))


def _parse_mistral(text: str, accept: Accept) -> tuple[str, list[Call]]:
    at = text.find(MISTRAL.marker)
    if at < 0:
        return text, []
    value = _loads(text[at + len(MISTRAL.marker):].strip())
    items = value if isinstance(value, list) else [value]
    calls = [c for c in (_call_of(item, accept) for item in items) if c is not None]
    if not calls or len(calls) != len(items):
        return text, []
    return text[:at].strip(), calls


_MISTRAL_ARGS_CALL = re.compile(
    r"\[TOOL_CALLS\]\s*([A-Za-z0-9_.\-]+)(?:\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\]")
_DECODER = json.JSONDecoder()


def _parse_mistral_args(text: str, accept: Accept) -> tuple[str, list[Call]]:
    calls: list[Call] = []
    kept: list[str] = []
    pos = 0
    for found in _MISTRAL_ARGS_CALL.finditer(text):
        if found.start() < pos:
            continue
        try:
            arguments, end = _DECODER.raw_decode(text, found.end())
        except ValueError:
            continue
        if not isinstance(arguments, dict) or not accept(found.group(1), arguments):
            continue
        kept.append(text[pos:found.start()])
        pos = end
        calls.append((found.group(1), arguments))
    kept.append(text[pos:])
    return "".join(kept).strip() if calls else text, calls


def _parse_llama3(text: str, accept: Accept) -> tuple[str, list[Call]]:
    """A reply that opens with a call's object (after `<|python_tag|>` or not); what it
    wrote after the object is what it said besides."""
    body = text.strip()
    if body.startswith(LLAMA3.marker):
        body = body[len(LLAMA3.marker):].strip()
    if not body.startswith("{"):
        return text, []
    try:
        value, end = _DECODER.raw_decode(body)
    except ValueError:
        return text, []
    call = _call_of(value, accept)
    return (text, []) if call is None else (body[end:].strip(), [call])


_XML_CALL = re.compile(r"<tool_call>\s*(<function=.*?</function>)\s*</tool_call>", re.DOTALL)
_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*)</function>\Z", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _parse_xml(text: str, accept: Accept) -> tuple[str, list[Call]]:
    def read(body: str) -> Call | None:
        function = _XML_FUNCTION.match(body)
        if function is None:
            return None
        name, inner = function.group(1).strip(), function.group(2)
        arguments: dict[str, Any] = {}
        pos = 0
        for parameter in _XML_PARAMETER.finditer(inner):
            if inner[pos:parameter.start()].strip():
                return None  # text between parameters: not a call as the format writes one
            arguments[parameter.group(1).strip()] = xml_value(parameter.group(2))
            pos = parameter.end()
        if inner[pos:].strip():
            return None
        return _typed(name, arguments, accept)

    return _parse_tagged(text, _XML_CALL, read)


def xml_value(raw: str) -> Any:
    """A parameter's value: JSON where it reads as JSON (a number, an object, a list), else
    the raw text; Python's spellings of True, False and None too (the templates write
    non-strings with Jinja's `string` filter)."""
    python = {"True": True, "False": False, "None": None}
    if raw in python:
        return python[raw]
    value = _loads(raw)
    return raw if value is None and raw != "null" else value


def _typed(name: str, arguments: dict[str, Any], accept: Accept) -> Call | None:
    """`arguments` read from text, as the tool's schema takes them: a value read as JSON
    that the schema wants as a string is given back as its text ("42" for a zip code)."""
    if accept(name, arguments):
        return name, arguments
    as_text = {k: v if isinstance(v, str) else xml_text(v) for k, v in arguments.items()}
    for key in arguments:
        trial = {**arguments, key: as_text[key]}
        if accept(name, trial):
            return name, trial
    return (name, as_text) if accept(name, as_text) else None


def xml_text(value: Any) -> str:
    """A value other than a string as the templates write it (Jinja's `string` filter)."""
    if isinstance(value, bool) or value is None:
        return {True: "True", False: "False", None: "None"}[value]
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) \
        else str(value)


_PY_CALLS = re.compile(re.escape(LFM2.marker) + r"\s*(\[.*?\])\s*(?:"
                       + re.escape(LFM2.end) + r"|\Z)", re.DOTALL)
_PY_NAMES = {"true": True, "false": False, "null": None}


def _parse_pythonic(text: str, accept: Accept) -> tuple[str, list[Call]]:
    calls: list[Call] = []
    kept: list[str] = []
    pos = 0
    for found in _PY_CALLS.finditer(text):
        group = _py_calls(found.group(1))
        if group is None or not all(accept(name, args) for name, args in group):
            continue
        kept.append(text[pos:found.start()])
        pos = found.end()
        calls += group
    kept.append(text[pos:])
    return "".join(kept).strip() if calls else text, calls


def _py_calls(body: str) -> list[Call] | None:
    """`[name(p=value, ...), ...]` as calls, by Python's parser and literal reader (never
    evaluated); JSON's true, false and null are read too. None: not such a list."""
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls: list[Call] = []
    for item in tree.elts:
        if (not isinstance(item, ast.Call) or not isinstance(item.func, ast.Name)
                or item.args or any(k.arg is None for k in item.keywords)):
            return None
        arguments: dict[str, Any] = {}
        for keyword in item.keywords:
            try:
                arguments[str(keyword.arg)] = py_value(keyword.value)
            except ValueError:
                return None
        calls.append((item.func.id, arguments))
    return calls


def py_value(node: ast.expr) -> Any:
    """A keyword's value: Python's literals, and JSON's true, false and null (never run)."""
    if isinstance(node, ast.Name) and node.id in _PY_NAMES:
        return _PY_NAMES[node.id]
    if isinstance(node, ast.List):
        return [py_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("a ** in a dict")
        return {py_value(k): py_value(v)  # type: ignore[arg-type]
                for k, v in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)


# --- writing ----------------------------------------------------------------------------------


def _xml_call(name: str, arguments: Mapping[str, Any]) -> str:
    parameters = "".join(
        f"<parameter={key}>\n{value if isinstance(value, str) else xml_text(value)}"
        f"\n</parameter>\n" for key, value in arguments.items())
    return f"<function={name}>\n{parameters}</function>"


def _py_literal(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "True", False: "False", None: "None"}[value]
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)}: {_py_literal(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_py_literal(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


# --- grammars ---------------------------------------------------------------------------------
#
# One call of the offered functions: the structure and the names, each parameter's value as
# its schema types it where the type is simple (an enum's values, an integer, a number, a
# boolean, a string), the required parameters first, then the optional ones, each in the
# schema's order (as llama.cpp's grammars of JSON schemas order an object's properties).
# Whatever else a schema says (patterns, lengths, nested objects) the check of the finished
# call decides.


class _Style(StrEnum):
    XML = "xml"  # <parameter=NAME>\nVALUE\n</parameter>\n, a string raw
    PYTHON = "python"  # NAME=VALUE, Python's or JSON's literals
    JSON = "json"  # "NAME": VALUE


def _literal(text: str) -> str:
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               .replace("\t", "\\t"))
    return f'"{escaped}"'


def _spelled(value: Any, style: _Style) -> str:
    """A schema's enum value as the style writes it."""
    if style is _Style.XML:
        return value if isinstance(value, str) else xml_text(value)
    if style is _Style.PYTHON:
        return _py_literal(value)
    return json.dumps(value, ensure_ascii=False)


def _value(schema: object, style: _Style) -> str:
    """The grammar of a parameter's value (an expression)."""
    if not isinstance(schema, Mapping):
        schema = {}
    enum = schema.get("enum")
    if (isinstance(enum, list) and enum
            and all(v is None or isinstance(v, str | int | float | bool) for v in enum)):
        return "( " + " | ".join(_literal(_spelled(v, style)) for v in enum) + " )"
    kind = schema.get("type")
    if kind == "integer":
        return "integer"
    if kind == "number":
        return "number"
    if kind == "boolean":
        return '( "true" | "false" )' if style is _Style.JSON else \
            '( "True" | "False" | "true" | "false" )'
    if style is _Style.XML:
        return "text"
    if kind == "string":
        return "string"
    return "json-value" if style is _Style.JSON else "literal"


def _parameter(name: str, schema: object, style: _Style) -> str:
    value = _value(schema, style)
    if style is _Style.XML:
        return f"{_literal(f'<parameter={name}>' + chr(10))} {value} {_literal(_CLOSE_PARAMETER)}"
    if style is _Style.PYTHON:
        return f"{_literal(name + '=')} {value}"
    return f"{_literal(json.dumps(name, ensure_ascii=False))} space \":\" space {value}"


def _arguments(function: Mapping[str, Any], style: _Style) -> str:
    """The grammar of a function's arguments (an expression; "" for none)."""
    parameters = function.get("parameters")
    schema = parameters if isinstance(parameters, Mapping) else {}
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):  # no names given: any parameters
        return {_Style.XML: '( "<parameter=" [A-Za-z0-9_]+ ">\\n" text '
                            f'{_literal(_CLOSE_PARAMETER)} )*',
                _Style.PYTHON: '( [A-Za-z_] [A-Za-z0-9_]* "=" literal '
                               '( "," space [A-Za-z_] [A-Za-z0-9_]* "=" literal )* )?',
                _Style.JSON: ""}[style]
    required = [str(n) for n in schema.get("required") or () if n in properties]
    optional = [str(n) for n in properties if n not in required]
    items = [_parameter(n, properties[n], style) for n in required]
    maybe = [_parameter(n, properties[n], style) for n in optional]
    if style is _Style.XML:
        return " ".join([*items, *(f"( {m} )?" for m in maybe)])
    separator = '"," space'
    if items:
        return " ".join([f" {separator} ".join(items),
                         *(f"( {separator} {m} )?" for m in maybe)])
    if not maybe:
        return ""
    # None required: the first one written has no separator before it.
    return "( " + " | ".join(
        " ".join([m, *(f"( {separator} {later} )?" for later in maybe[i + 1:])])
        for i, m in enumerate(maybe)) + " )?"


def _alternatives(functions: Sequence[Mapping[str, Any]], rule: Callable[[Mapping[str, Any]], str]
                  ) -> tuple[str, str]:
    """(the choice among the functions' rules, the rules)."""
    rules = "".join(f"function-{i} ::= {rule(f)}\n" for i, f in enumerate(functions))
    return "( " + " | ".join(f"function-{i}" for i in range(len(functions))) + " )", rules


_BASE_RULES = (
    'string ::= "\\"" ( [^"\\\\\\x7F\\x00-\\x1F] | "\\\\" ( ["\\\\/bfnrt] '
    '| "u" [0-9a-fA-F]{4} ) )* "\\""\n'
    'integer ::= "-"? ( [0-9] | [1-9] [0-9]{1,15} )\n'
    'number ::= integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,4} )?\n'
    'literal ::= string | number | "True" | "False" | "None" | "true" | "false" | "null" '
    '| "[" space ( literal ( space "," space literal )* )? space "]" '
    '| "{" space ( string space ":" space literal '
    '( space "," space string space ":" space literal )* )? space "}"\n'
    'json-value ::= string | number | "true" | "false" | "null" '
    '| "[" space ( json-value ( space "," space json-value )* )? space "]" '
    '| "{" space ( string space ":" space json-value '
    '( space "," space string space ":" space json-value )* )? space "}"\n'
    'text ::= ( [^<] | "<" [^/] )*\n'
    # One space or line break where the templates write one: a model writes its calls as
    # it was trained to; a looser rule lets a random or unsure model spend its tokens on
    # blanks.
    'space ::= [ \\n]?\n')
_CLOSE_PARAMETER = "\n</parameter>\n"


def after_space(grammar: str) -> str:
    """`grammar` (rooted at `root`) with free whitespace before it: for a grammar that holds
    from a trigger models follow with a line break or two (the end of their reasoning)."""
    body = re.sub(r"^root ::=", "arbor-after ::=", grammar, count=1, flags=re.MULTILINE)
    return f"root ::= [ \\t\\n]{{0,20}} arbor-after\n{body}"


def _named_json_grammar(functions: Sequence[Mapping[str, Any]], opening: str) -> str:
    """`[TOOL_CALLS]` (unless lazy: after it), a function's name, an optional call id, and
    its arguments' object."""
    def rule(function: Mapping[str, Any]) -> str:
        return (f"{_literal(function['name'])} ( \"[CALL_ID]\" [A-Za-z0-9]{{9}} )? "
                f"\"[ARGS]\" \"{{\" space {_arguments(function, _Style.JSON)} space \"}}\"")

    choice, rules = _alternatives(functions, rule)
    head = f"{_literal(opening)} " if opening else ""
    return f"root ::= {head}space {choice}\n{rules}{_BASE_RULES}"


def _xml_grammar(functions: Sequence[Mapping[str, Any]], opening: str) -> str:
    """`<tool_call>` (unless lazy: after it), one function and its parameters, then the
    closing tags."""
    def rule(function: Mapping[str, Any]) -> str:
        return (f"{_literal('<function=' + function['name'] + '>' + chr(10))} "
                f"{_arguments(function, _Style.XML)} {_literal('</function>')}")

    choice, rules = _alternatives(functions, rule)
    head = f"{_literal(opening)} " if opening else ""
    return (f"root ::= {head}space {choice} space {_literal('</tool_call>')}\n"
            f"{rules}{_BASE_RULES}")


def _pythonic_grammar(functions: Sequence[Mapping[str, Any]], opening: str, start: str,
                      end: str, joiner: str) -> str:
    """`[name(p=value, …), …]` of the functions."""
    def rule(function: Mapping[str, Any]) -> str:
        return f"{_literal(function['name'] + '(')} {_arguments(function, _Style.PYTHON)} \")\""

    choice, rules = _alternatives(functions, rule)
    head = f"{_literal(opening)} " if opening else ""
    return (f"root ::= {head}space {_literal(start)} {choice} "
            f"( {_literal(joiner.strip())} space {choice} )* {_literal(end)}\n"
            f"{rules}{_BASE_RULES}")
