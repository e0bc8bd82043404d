"""Benchmark: giving tokens to a long path that has none (an API request, an import).

Builds paths of N alternating user/assistant messages of 380 characters each, none with
tokens, and times `PromptBuilder.ensure_tokens` with the bundled model's chat template and
tokenizer; then runs it again under tracemalloc for the peak memory it allocates and counts
the Jinja renderings.

    flock /tmp/arbor-model.lock .venv/bin/python -m tests.bench.bench_prompt [--sizes 500 1000]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from engine.core.prompt import ChatTemplate, PromptBuilder, Tokenizer
from engine.core.tree import Role, Tree
from engine.llm.llama import LlamaModel
from engine.models.files import default_model_path


def build(size: int) -> Tree:
    tree = Tree("Be brief.")
    words = "lorem ipsum dolor sit amet "
    for index in range(size):
        text = (f"{index} " + words * 15)[:380]
        tree.add_child(tree.active_leaf, Role.USER if index % 2 == 0 else Role.ASSISTANT, text)
    return tree


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000, 10_000])
    args = parser.parse_args()
    model = LlamaModel(default_model_path())
    try:
        source = model.chat_template()
        assert source is not None
        template = ChatTemplate(source, bos_text=model.bos_text, eos_text=model.eos_text)
        renders = [0]
        render = template.render

        def counted(*a: object, **k: object) -> str:
            renders[0] += 1
            return render(*a, **k)  # type: ignore[arg-type]

        template.render = counted  # type: ignore[method-assign]
        for size in args.sizes:
            builder = PromptBuilder(template, Tokenizer(tokenize=model.tokenize, bos=model.bos))
            path = build(size).active_path()
            renders[0] = 0
            started = time.perf_counter()
            builder.ensure_tokens(path)
            took = time.perf_counter() - started
            count = renders[0]
            path = build(size).active_path()
            tracemalloc.start()
            builder.ensure_tokens(path)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            chars = sum(len(node.text) for node in path)
            print(f"{size:6} messages ({chars / 2**20:.2f} MiB): {took:7.2f} s, "
                  f"{count:6} renderings, peak +{peak / 2**20:8.1f} MiB")
    finally:
        model.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
