"""llama-cpp-python's own server, run as the API session benchmark runs it:

    python -m engine.bench.plain_server --model M.gguf --port 8000 --n-ctx 4096

on the CPU library Arbor chose and with repacking as Arbor's engine runs it (a plain
`python -m llama_cpp.server` would load no CPU backend from a portable build), llama-cpp-python's
defaults otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="plain_server")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--n-batch", type=int, default=512)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--chat-format", default=None)
    args = parser.parse_args(argv)
    from engine.llm.llama import default_thread_count, serve_plain

    with contextlib.suppress(KeyboardInterrupt):  # how the benchmark stops it
        serve_plain(args.model, host=args.host, port=args.port, n_ctx=args.n_ctx,
                    n_batch=args.n_batch, n_threads=args.threads or default_thread_count(),
                    chat_format=args.chat_format)


if __name__ == "__main__":
    main()
