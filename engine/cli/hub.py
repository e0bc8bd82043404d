"""`arbor-engine search TEXT` and `arbor-engine pull REPO[:QUANT]`: the window's Discover and
download code, from a terminal. Results go to stdout, progress to stderr; a pull that stopped
(Ctrl-C, a dropped network, a killed terminal) resumes when run again."""

from __future__ import annotations

import argparse
import sys
import time

from engine.core.errors import printable
from engine.files.paths import data_dirs
from engine.models.credentials import load_token
from engine.models.download import Downloader
from engine.models.download_transfer import Progress
from engine.models.hub import HubClient, SortOrder, parse_model_spec
from engine.models.recommended import load_recommended
from engine.models.remote import Hub

PROGRESS_EVERY = 1.0  # seconds between progress lines


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="?", default="",
                        help="words of a repository name; empty: the recommended models")
    parser.add_argument("--sort", choices=["downloads", "trending", "likes", "recent"],
                        default="downloads")
    parser.add_argument("--limit", type=int, default=20, help="at most this many (1..100)")


def add_pull_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="owner/name or owner/name:QUANT (e.g. "
                                      "ggml-org/gemma-3-1b-it-GGUF:Q4_K_M)")


def search(args: argparse.Namespace) -> int:
    if not args.text.strip():
        for r in load_recommended():
            size = f"{r.approx_gb:.1f} GB" if r.approx_gb else "size unknown"
            sys.stdout.write(f"{r.spec}\t{r.memory_kind.value}\t{size}\t{r.license}\n")
        return 0
    sort = {"downloads": SortOrder.DOWNLOADS, "trending": SortOrder.TRENDING,
            "likes": SortOrder.LIKES, "recent": SortOrder.RECENT}[args.sort]
    client = HubClient(Hub(token=load_token()))
    for found in client.search(args.text, sort=sort, limit=args.limit):
        gated = "\tgated" if found.gated else ""
        sys.stdout.write(f"{printable(found.repo)}\t{found.downloads} downloads\t"
                         f"{printable(found.license or 'no license')}{gated}\n")
    return 0


def pull(args: argparse.Namespace) -> int:
    repo, quant = parse_model_spec(args.model)
    hub = Hub(token=load_token())
    client = HubClient(hub)
    details = client.details(repo)
    group = details.group(quant)
    remotes = client.remote_files(details, group)
    size = _size(group.size) if group.size is not None else "size unknown"
    parts = f" in {len(remotes)} parts" if len(remotes) > 1 else ""
    sys.stderr.write(f"pulling {details.repo}:{group.quant} ({size}{parts})\n")
    downloader = Downloader(data_dirs().models, hub)
    reporter = _Reporter()
    for remote in remotes:
        done = downloader.download(remote, progress=reporter)
        resumed = f", resumed from {done.resumed_from} bytes" if done.resumed_from else ""
        sys.stderr.write(f"{printable(done.path.name)}: {done.size} bytes, sha256 "
                         f"{done.sha256} verified ({done.fetched} fetched{resumed}, "
                         f"{done.retries} retries)\n")
    sys.stdout.write(f"{printable(data_dirs().models / remotes[0].name, limit=4096)}\n")
    return 0


class _Reporter:
    """Progress lines on stderr, at most one a second per file."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY and p.done != p.total:
            return
        self._last = now
        of = f" of {p.total / (1 << 20):.1f}" if p.total else ""
        pct = f" ({100 * p.done // p.total}%)" if p.total else ""
        speed = f", {p.bytes_per_second / (1 << 20):.1f} MiB/s" if p.bytes_per_second else ""
        left = f", {int(p.seconds_left)} s left" if p.seconds_left is not None else ""
        sys.stderr.write(f"{printable(p.name)}: {p.done / (1 << 20):.1f}{of} MiB{pct}"
                         f"{speed}{left}\n")


def _size(n: int) -> str:
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.2f} GiB"
