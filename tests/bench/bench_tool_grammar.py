"""Benchmark: what a lazy call grammar (tools offered, tool_choice "auto") costs per token
while the reply begins no call, against the same reply with no tools, interleaved.

SmolLM2 (the bundled model) on one prompt, greedy; per round the plain reply and the reply
under the lazy Hermes call grammar of two tools, in alternating order, each from the same
prepared prompt (the prompt is the same: SmolLM2's template takes no tools, and what is
measured is the sampler). Both replies are the same tokens (checked). Also, for scale, a
forced call's grammar (it holds from the first token, and the reply is short), and "auto"
once a call has begun (told that the reply so far opened one: `LazyGrammar.written`).

    flock /tmp/arbor-model.lock .venv/bin/python -m tests.bench.bench_tool_grammar --rounds 6

ms/token: the generation's time after its first token over the tokens after the first.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from engine.config.params import SamplingParams
from engine.core.call_formats import HERMES
from engine.core.tree import Role, Tree
from engine.llm.generator import Generator
from engine.llm.reply import call_sampling
from engine.llm.runtime import Generation, Runtime, RuntimeSettings
from engine.models.files import default_model_path

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object", "properties": {"hours": {"type": "integer"}},
        "required": ["hours"], "additionalProperties": False}}},
]
GREEDY = SamplingParams(temperature=0.0)


def per_token_ms(generation: Generation) -> float:
    after_first = len(generation.tokens) - 1
    return (generation.decode_ms - (generation.ttft_ms or 0.0)) / max(after_first, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    runtime = Runtime(default_model_path(), RuntimeSettings(n_ctx=2048, n_batch=256))
    generator = Generator(runtime, sampling=GREEDY, use_cache=False)
    tree = Tree("You are a helpful assistant.")
    asked = tree.add_child(tree.root.id, Role.USER,
                           "Tell me a long story about a river that runs to the sea.")
    path = tree.path_to(asked.id)
    lazy = call_sampling(GREEDY, TOOLS, HERMES)
    assert lazy.json_lazy is not None
    modes = {"no tools": GREEDY, "auto, lazy grammar": lazy,
             "forced call": call_sampling(replace(GREEDY, tool_choice="required"), TOOLS,
                                          HERMES),
             "auto, call begun": replace(lazy, json_lazy=replace(
                 lazy.json_lazy, written='<tool_call>\n{"name": "get_weather", "arguments": '
                                         '{"city": "'))}
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    counts: dict[str, int] = {}
    for round_ in range(args.rounds):
        order = list(modes) if round_ % 2 == 0 else list(reversed(modes))
        replies: dict[str, Generation] = {}
        for mode in order:
            generator.prepare(path)
            replies[mode] = generator.generate(max_tokens=args.tokens, seed=1,
                                               sampling=modes[mode])
            times[mode].append(per_token_ms(replies[mode]))
            counts[mode] = len(replies[mode].tokens)
        assert replies["auto, lazy grammar"].tokens == replies["no tools"].tokens
    base = statistics.median(times["no tools"])
    for mode, values in times.items():
        median = statistics.median(values)
        print(f"{mode:20} {median:6.2f} ms/token (median of {len(values)}, "
              f"{counts[mode]} tokens; min {min(values):.2f}, max {max(values):.2f}); "
              f"x{median / base:.3f} of no tools")


if __name__ == "__main__":
    main()
