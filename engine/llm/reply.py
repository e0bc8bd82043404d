"""One reply, start to finish: prepare the prompt, generate, finish the reply's tokens.

The engine service (engine.service.handler) runs every reply through `run_reply`, on the
engine's thread or in its process, for every front end. It reads a path of nodes and returns
plain values (`ReplyResult`, with its `ReplyReport`); applying them to a tree is the reply's
lifetime's business (engine.service.lifetime).

This module loads no native library: the generator is only named in annotations, so the value
types can cross a process boundary and be read where no model is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine.config.params import LazyGrammar, SamplingParams
from engine.core.call_formats import Syntax, ToolFormat, ToolSupport, after_space
from engine.core.errors import UnsupportedRequest
from engine.core.overflow import Overflow, read_part
from engine.core.results import (
    LEFT_OUT,
    CancelFn,
    OpenedFn,
    PieceFn,
    PlanFn,
    ProgressFn,
    Rendered,
    ReplyReport,
    ReplyResult,
)
from engine.core.tools import (
    TOOL_CALLS,
    ToolCall,
    call_schema,
    tool_names,
    tools_of,
    valid_call,
)
from engine.core.tree import Node

if TYPE_CHECKING:
    from engine.llm.generator import Generator




def _tool_format(generator: Generator) -> ToolFormat:
    try:
        return generator.prompts.tool_format()
    except ToolSupport as exc:
        raise UnsupportedRequest(str(exc)) from None


def call_sampling(sampling: SamplingParams, tools: list[dict[str, Any]], calling: ToolFormat
                  ) -> SamplingParams:
    """`sampling` with the grammar of the reply's calls: of the call `tool_choice` forces,
    from the reply's start; under "auto", of a call of any of the tools, lazy: it holds from
    the format's marker on, so a call the model begins is valid, and the reply is the same
    as without it until then. (A reply that must follow response_format's schema keeps
    that grammar.)"""
    choice = sampling.tool_choice
    if choice not in ("auto", "required") and choice not in tool_names(tools):
        raise UnsupportedRequest(f"tool_choice names {choice!r}, which is not among the tools")
    if calling.syntax is not Syntax.JSON:
        if choice == "auto" and sampling.json_schema is not None:
            return sampling
        free = choice == "auto"
        return replace(sampling, grammar=calling.grammar(
            tools, "required" if free else choice, lazy=free),
            json_lazy=LazyGrammar(calling.marker) if free else None)
    if choice == "auto":
        if sampling.json_schema is not None:
            return sampling
        lazy = LazyGrammar(calling.marker, at_open=calling.at_open, joiner=calling.joiner)
        return replace(sampling,
                       json_schema=json.dumps(call_schema(tools, "required", calling.key)),
                       json_around=(calling.prefix.removeprefix(calling.marker),
                                    calling.suffix), json_lazy=lazy)
    return replace(sampling, json_schema=json.dumps(call_schema(tools, choice, calling.key)),
                   json_around=(calling.prefix, calling.suffix))


def after_reasoning(sampling: SamplingParams, closer: str) -> SamplingParams:
    """`sampling` for a reply that starts inside its reasoning: a grammar that would hold from
    the reply's start (a forced call, JSON output) holds from the end of its reasoning
    (`closer`) to the reply's end instead, so the model reasons as it would, then writes what
    the grammar asks (llama-server's chat formats do the same with a forced-open `<think>`). A
    grammar that is lazy already (a call under "auto") is left as it is."""
    if sampling.json_lazy is not None or (sampling.json_schema is None
                                          and sampling.grammar is None):
        return sampling
    grammar = after_space(sampling.grammar) if sampling.grammar is not None else None
    return replace(sampling, grammar=grammar, json_lazy=LazyGrammar(closer, once=True))


def _take_calls(text: str, meta: dict[str, Any], tools: list[dict[str, Any]],
                calling: ToolFormat, sampling: SamplingParams) -> str:
    """The reply's text without its tool calls, which go into `meta` (TOOL_CALLS); the
    reply keeps the tokens the model wrote them in."""
    said, calls = calling.parse(text, lambda name, arguments: valid_call(tools, name,
                                                                         arguments))
    if not calls:
        return text
    if not sampling.parallel_tool_calls:
        calls = calls[:1]
    meta[TOOL_CALLS] = [ToolCall.new(name, arguments).to_meta() for name, arguments in calls]
    return said


def rendered(path: Sequence[Node], untokenized: set[int]) -> Rendered:
    """The tokens a prepare gave path nodes that had none (ids from `untokenized`)."""
    return tuple((node.id, node.tokens) for node in path
                 if node.id in untokenized and node.tokens is not None)


def run_reply(
    generator: Generator,
    path: Sequence[Node],
    *,
    resume: Node | None = None,
    max_tokens: int,
    seed: int,
    on_plan: PlanFn | None = None,
    on_progress: ProgressFn | None = None,
    on_piece: PieceFn | None = None,
    on_opened: OpenedFn | None = None,
    cancel: CancelFn | None = None,
    sampling: SamplingParams | None = None,
    overflow: Overflow = Overflow.STOP,
    scope: str = "",
) -> ReplyResult:
    """Answer the last node of `path` (or go on with `resume`, a reply to it).

    Under `Overflow.DROP_OLDEST` a path too long for the context is read without its oldest
    messages (`engine.core.overflow`); the reply's meta says how many it left out (`LEFT_OUT`).
    The generation prompt is rendered once, for the reply's tokens. A stop during the
    prepare raises `Cancelled` (nothing was said); a stop during generation returns what was
    said so far, finished as `FinishReason.CANCELLED`. Other errors propagate. Call
    `generator.after_reply()` once the result is delivered (it takes a dense cache's
    prompt-end checkpoint and may spill checkpoints).
    `on_opened` is called before the first piece when the generation prompt opened the
    reply's reasoning, so a front end shows the streaming text as reasoning from the start
    (the finished reply's meta says so too: `engine.core.reasoning.OPENED`).
    `scope`: whose request it is; only that scope's cached state is reused.
    """
    tools = tools_of(path[0].meta) if path else None
    calling = None
    if tools is not None:
        calling = _tool_format(generator)
        sampling = call_sampling(sampling or generator.sampling, tools, calling)
    untokenized = {node.id for node in path if node.tokens is None}
    cut = generator.fit(path, resume=resume, max_tokens=max_tokens, overflow=overflow,
                        cancel=cancel)
    read = read_part(path, cut)
    prepared = generator.prepare(read, resume=resume, on_progress=on_progress,
                                 on_plan=on_plan, cancel=cancel, scope=scope)
    constrained = sampling is not None and (sampling.json_schema is not None
                                            or sampling.grammar is not None)
    closer = generator.reasoning_closer(read) if on_opened is not None or constrained else None
    if closer is not None:
        if on_opened is not None:
            on_opened()
        if sampling is not None:
            sampling = after_reasoning(sampling, closer)
    if sampling is not None and sampling.json_lazy is not None and prepared.base_text:
        # A continued reply: a call it had begun goes on under the grammar.
        sampling = replace(sampling, json_lazy=replace(sampling.json_lazy,
                                                       written=prepared.base_text))
    generation = generator.generate(
        max_tokens=max_tokens, seed=seed, cancel=cancel, sampling=sampling,
        on_token=(lambda _token, piece: on_piece(piece)) if on_piece is not None else None,
    )
    text = prepared.base_text + generation.text
    finished = generator.reply_tokens(read, [*prepared.before, *generation.tokens], text)
    prep = prepared.report
    ttft = prep.prefill_ms + generation.ttft_ms if generation.ttft_ms is not None else None
    report = replace(ReplyReport.of_prepare(prep), ttft_ms=ttft,
                     generated_tokens=len(generation.tokens), decode_ms=generation.decode_ms,
                     finish=generation.finish, dropped=cut.dropped)
    meta = finished.meta()
    if calling is not None and tools is not None:
        text = _take_calls(text, meta, tools, calling, sampling or generator.sampling)
    if cut.dropped:
        meta[LEFT_OUT] = cut.dropped  # a count, not ids: imports renumber nodes
    return ReplyResult(text, finished.tokens, tuple(meta.items()),
                       rendered(path, untokenized), report, generation.logprobs)
