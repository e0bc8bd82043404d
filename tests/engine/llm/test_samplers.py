"""The samplers an API request may set (penalties, logit bias, a JSON schema's grammar) on
real llama.cpp: they do what llama.cpp's own arithmetic says, a reply with them is the same
whether the prompt came from the cache or a full reprocess, and what a model cannot do is
refused before a token is drawn."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from engine.core.call_formats import HERMES, LLAMA3
from engine.core.errors import UnsupportedRequest
from engine.core.memory import MemoryKind
from engine.core.tools import valid_call
from engine.core.tree import Role, Tree
from engine.llm.generator import Generator
from engine.llm.llama import LlamaModel, Sampler, SamplingParams, json_grammar
from engine.llm.reply import call_sampling
from engine.llm.runtime import FinishReason, Source
from engine.storage.checkpoints import CheckpointStore
from tests.conftest import ALL_KINDS, RuntimeFactory
from tests.helpers import random_tokens

GREEDY = SamplingParams(temperature=0.0)
HOT = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
PENALIZED = replace(GREEDY, repeat_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3,
                    penalty_last_n=48)


def _penalized(logits: np.ndarray, history: list[int], params: SamplingParams) -> np.ndarray:
    """llama.cpp's logit bias then penalties (llama-sampling.cpp), in numpy."""
    out = logits.astype(np.float32).copy()
    for token, bias in params.logit_bias:
        out[token] += np.float32(bias)
    window = history[-params.penalty_last_n:] if params.penalty_last_n else []
    counts: dict[int, int] = {}
    for token in window:
        counts[token] = counts.get(token, 0) + 1
    for token, count in counts.items():
        value = out[token]
        value = value * np.float32(params.repeat_penalty) if value <= 0 else \
            value / np.float32(params.repeat_penalty)
        out[token] = value - np.float32(count * params.frequency_penalty
                                        + params.presence_penalty)
    return out


def test_penalties_and_logit_bias_choose_as_llama_cpps_arithmetic_says(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """The prompt's last tokens count for the penalties (as llama-server's prompt does); a
    bias of -100 bans the model's favourite, +100 forces a token. Checked over many prompts
    so that the penalties change the choice in some of them."""
    runtime = make_runtime(tiny_models["dense"], n_ctx=256, n_batch=64)
    changed = 0
    for seed in range(12):
        # Repeats, so the penalties have counts above one to work with.
        prompt = random_tokens(20, seed=seed) * 3
        runtime.prepare(prompt)
        logits = runtime.last_logits()
        favourite, runner_up = (int(t) for t in np.argsort(logits)[::-1][:2])
        # The history the penalties count: the prompt, and the favourites said before.
        history = [*prompt, favourite, runner_up, favourite][seed % 3:]
        banned = replace(PENALIZED, logit_bias=((favourite, -100.0),))
        for params in (PENALIZED, banned):
            expected = int(np.argmax(_penalized(logits, history, params)))
            sampler = Sampler(params, seed, model=runtime.model, history=history)
            try:
                assert sampler.sample(runtime.ctx) == expected
            finally:
                sampler.close()
            changed += expected != favourite
        forced = Sampler(replace(GREEDY, logit_bias=((7, 100.0),)), seed, model=runtime.model)
        try:
            assert forced.sample_logits(logits) == 7
        finally:
            forced.close()
    assert changed > 12  # every banned one, and some of the merely penalized


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_a_penalized_biased_reply_from_the_cache_is_a_full_reprocesss(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """A swipe with penalties and a bias: the prompt comes from the cache (nothing decoded),
    the penalties still see the whole prompt, and the reply is a cold context's."""
    sampling = replace(HOT, repeat_penalty=1.2, presence_penalty=0.5, penalty_last_n=200,
                       logit_bias=((300, 5.0), (311, -100.0)))
    runtime = make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=32)
    store = CheckpointStore(runtime.identity())
    generator = Generator(runtime, sampling=sampling, checkpoints=store)
    tree = Tree("S")
    first = tree.add_child(tree.root.id, Role.USER, "The river " * 30)
    path = tree.path_to(first.id)
    generator.prepare(path)
    one = generator.generate(max_tokens=12, seed=5)
    generator.after_reply()
    report = generator.prepare(path).report
    assert report.decoded_tokens == 0 and report.source in (Source.LIVE, Source.CHECKPOINT)
    again = generator.generate(max_tokens=12, seed=5)
    cold = Generator(make_runtime(tiny_models[kind.value], n_ctx=1024, n_batch=32),
                     sampling=sampling, use_cache=False)
    cold.prepare(path)
    assert again.tokens == one.tokens == cold.generate(max_tokens=12, seed=5).tokens
    assert 311 not in one.tokens


SCHEMA = {
    "type": "object",
    "properties": {"river": {"type": "string", "enum": ["Nile", "Amazon", "Danube"]},
                   "long": {"type": "boolean"}},
    "required": ["river", "long"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(("schema", "sampling"), [(SCHEMA, HOT), ({"type": "object"}, GREEDY)],
                         ids=["schema", "object"])
def test_a_json_schema_reply_parses_and_validates(
    schema: dict[str, object], sampling: SamplingParams, smollm2_path: Path,
    make_runtime: RuntimeFactory
) -> None:
    """The grammar checks each drawn token and draws again from what it allows when it
    refuses one: the reply ends where the grammar lets it, as JSON that validates. (The
    schema's replies are short whatever is drawn; any object can run on, so greedy.)"""
    runtime = make_runtime(smollm2_path, n_ctx=1024, n_batch=64)
    generator = Generator(runtime, sampling=GREEDY)
    tree = Tree("You answer in JSON.")
    ask = tree.add_child(tree.root.id, Role.USER, "Name the longest river, and say if it is "
                                                  "long.")
    grammar = replace(sampling, json_schema=json.dumps(schema))
    free = []
    for seed in range(3):
        generator.prepare(tree.path_to(ask.id))
        reply = generator.generate(max_tokens=300, seed=seed, sampling=grammar)
        assert reply.finish is FinishReason.STOP
        value = json.loads(reply.text)
        jsonschema.validate(value, schema)
        generator.prepare(tree.path_to(ask.id))
        free.append(generator.generate(max_tokens=40, seed=seed, sampling=sampling).text)
    assert not any(_is_json(text) for text in free)  # the model alone does not write JSON


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima"]}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object", "properties": {"hours": {"type": "integer"},
                                         "loud": {"type": "boolean"}},
        "required": ["hours", "loud"], "additionalProperties": False}}},
]


class _Noise:
    """Logits no model would give: every draw a surprise, unless one token is pushed."""

    def __init__(self, model: LlamaModel, seed: int) -> None:
        self.model = model
        self.rng = np.random.default_rng(seed)

    def __call__(self, pushed: int | None = None) -> np.ndarray:
        logits = self.rng.normal(0.0, 4.0, self.model.n_vocab).astype(np.float32)
        if pushed is not None:
            logits[pushed] += 100.0
        return logits

    def until_free(self, sampler: Sampler) -> list[int]:
        """Draw while a call's grammar holds (at most 300 tokens)."""
        drawn: list[int] = []
        while sampler.constrained and len(drawn) < 300:
            drawn.append(sampler.sample_logits(self()))
        assert not sampler.constrained, "the call never ended"
        return drawn

    def text(self, tokens: list[int]) -> str:
        return b"".join(self.model.token_bytes(t, special=True) for t in tokens).decode(
            "utf-8", errors="replace")


def _valid(name: str, arguments: dict[str, object]) -> bool:
    return valid_call(TOOLS, name, arguments)


def test_a_lazy_grammar_holds_from_a_calls_marker_until_the_call_is_whole(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """Under tool_choice "auto" the reply is the plain sampler's draw for draw until it
    writes the call marker; from there the call is a valid call of an offered tool however
    wild the draws, and once it is whole the reply is free again (a second call holds too)."""
    model = make_runtime(tiny_models["dense"], n_ctx=256, n_batch=32).model
    lazy = call_sampling(HOT, TOOLS, HERMES)
    for seed in range(4):
        noise = _Noise(model, seed)
        sampler, plain = Sampler(lazy, seed, model=model), Sampler(HOT, seed, model=model)
        try:
            tokens: list[int] = []
            for _ in range(30):
                logits = noise()
                tokens.append(sampler.sample_logits(logits))
                assert tokens[-1] == plain.sample_logits(logits) and not sampler.constrained
            for _ in range(2):
                for token in model.tokenize("\n<tool_call>"):
                    tokens.append(sampler.sample_logits(noise(token)))
                assert sampler.constrained
                tokens += noise.until_free(sampler)
        finally:
            sampler.close()
            plain.close()
        text = noise.text(tokens)
        said, calls = HERMES.parse(text, _valid)
        assert len(calls) == 2, text
        assert said == text[: text.index("<tool_call>")].strip()


def test_a_call_the_reply_opens_with_or_had_begun_is_held_from_there(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """Llama 3 writes a call as the reply's JSON: the grammar holds from the opening brace,
    which came in the same token as what follows it. A continued reply that had begun a call
    goes on under the grammar from where it stopped."""
    model = make_runtime(tiny_models["dense"], n_ctx=256, n_batch=32).model
    opening = model.tokenize('{"')
    assert len(opening) == 1  # the brace and the quote in one token
    llama = call_sampling(HOT, TOOLS, LLAMA3)
    begun = 'Sure.\n<tool_call>\n{"name": "set_'
    hermes = call_sampling(HOT, TOOLS, HERMES)
    assert hermes.json_lazy is not None
    continued = replace(hermes, json_lazy=replace(hermes.json_lazy, written=begun))
    for seed in range(3):
        noise = _Noise(model, seed)
        sampler = Sampler(llama, seed, model=model)
        try:
            tokens = [sampler.sample_logits(noise(opening[0]))]
            assert sampler.constrained
            tokens += noise.until_free(sampler)
        finally:
            sampler.close()
        _said, calls = LLAMA3.parse(noise.text(tokens), _valid)
        assert len(calls) == 1
        sampler = Sampler(continued, seed, model=model)
        try:
            assert sampler.constrained
            text = begun + noise.text(noise.until_free(sampler))
        finally:
            sampler.close()
        said, ((name, _arguments),) = HERMES.parse(text, _valid)
        assert said == "Sure." and name == "set_alarm"


def test_a_json_string_holds_no_raw_control_character(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """JSON allows no raw newline or tab in a string (json.loads refuses one): the grammar
    draws again when the model wants one there."""
    model = make_runtime(tiny_models["dense"], n_ctx=256, n_batch=32).model
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    sampler = Sampler(replace(GREEDY, json_schema=json.dumps(schema)), 0, model=model)
    rng = np.random.default_rng(0)
    pushed = [*model.tokenize('{"a": "'), *model.tokenize("\n\t") * 4]
    try:
        tokens = []
        for token in pushed:
            logits = rng.normal(0.0, 1.0, model.n_vocab).astype(np.float32)
            logits[token] += 100.0
            tokens.append(sampler.sample_logits(logits))
    finally:
        sampler.close()
    text = b"".join(model.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")
    assert text.startswith('{"a": "') and not any(ch in text for ch in "\n\t\r")


def test_what_no_grammar_or_vocabulary_allows_is_refused(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    with pytest.raises(UnsupportedRequest, match="grammar"):
        json_grammar(json.dumps({"$ref": "https://example.com/elsewhere.json"}))
    runtime = make_runtime(tiny_models["dense"], n_ctx=256, n_batch=64)
    runtime.prepare(random_tokens(10))
    outside = replace(GREEDY, logit_bias=((runtime.model.n_vocab, 1.0),))
    with pytest.raises(UnsupportedRequest, match="not in this model's vocabulary"):
        runtime.generate(max_tokens=4, sampling=outside, seed=1)
    # The context is as it was: a plain reply goes on from the same prompt.
    assert len(runtime.generate(max_tokens=4, sampling=GREEDY, seed=1).tokens) > 0


@pytest.mark.parametrize("kind", [MemoryKind.DENSE, MemoryKind.RECURRENT], ids=lambda k: k.value)
def test_logprobs_are_the_models_and_the_same_from_kept_logits(
    kind: MemoryKind, tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """OpenAI's logprobs: each token's log-softmax under the logits it was drawn from, with
    the likeliest alternatives in order; a swipe sampled from kept logits gives the same."""
    runtime = make_runtime(tiny_models[kind.value], n_ctx=512, n_batch=32)
    store = CheckpointStore(runtime.identity())
    generator = Generator(runtime, sampling=GREEDY, checkpoints=store)
    tree = Tree("S")
    path = tree.path_to(tree.add_child(tree.root.id, Role.USER, "The river " * 10).id)
    generator.prepare(path)
    logits = runtime.last_logits().astype(np.float64)
    asked = replace(HOT, top_logprobs=4)
    one = generator.generate(max_tokens=6, seed=2, sampling=asked)
    generator.after_reply()
    assert len(one.logprobs) == len(one.tokens) == 6
    expected = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    first = one.logprobs[0]
    assert first.logprob == pytest.approx(expected[one.tokens[0]], abs=1e-9)
    ranked = np.argsort(-expected)[:4]
    assert [lp for _, _, lp in first.top] == pytest.approx(list(expected[ranked]), abs=1e-9)
    assert first.data == runtime.model.token_bytes(one.tokens[0])
    assert generator.prepare(path).report.decoded_tokens == 0  # from the kept logits
    again = generator.generate(max_tokens=6, seed=2, sampling=asked)
    assert again.tokens == one.tokens and again.logprobs == one.logprobs
    plain = generator.generate(max_tokens=2, seed=2, sampling=HOT)
    assert plain.logprobs == ()
