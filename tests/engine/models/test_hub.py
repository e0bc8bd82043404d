"""Discover's engine side against a local stand-in for the hub (tests/engine/models/fake_hub.py),
with the real `huggingface_hub` client: search, a repository's quantizations, the header read
over HTTP ranges, fit from that header, the recommended list, and the errors a user sees."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.core.memory import MemoryKind
from engine.models.files import read_model_info, wanted_header_key
from engine.models.fit import MIN_CONTEXT, Verdict, available_ram, check_fit, shape_of
from engine.models.gguf_header import read_gguf_header
from engine.models.hub import HubClient, SortOrder, fit_of, parse_model_spec
from engine.models.quants import RepoFile, group_files, parse_gguf_name, pick_group
from engine.models.recommended import load_recommended
from engine.models.remote import (
    BadRepoNameError,
    Hub,
    HubCancelledError,
    HubNotFoundError,
    HubOfflineError,
)
from engine.models.remote_header import read_remote_header
from tests.engine.models.fake_hub import FakeHub, FakeHubServer

REPO = "arbor-test/tiny-GGUF"


@pytest.fixture
def fake_hub(tiny_models: dict[str, Path]) -> Iterator[FakeHub]:
    dense = tiny_models["dense"].read_bytes()
    half = len(dense) // 2
    with FakeHubServer() as hub:
        hub.add_repo(REPO, {
            "tiny-dense-F32.gguf": dense,
            "Q4_K_M/tiny-dense-Q4_K_M-00001-of-00002.gguf": dense[:half],
            "Q4_K_M/tiny-dense-Q4_K_M-00002-of-00002.gguf": dense[half:],
            "mmproj-tiny-F16.gguf": b"GGUF projector",
            "README.md": b"# tiny",
        }, downloads=50, trending=1.0)
        for kind, path in tiny_models.items():
            hub.add_repo(f"arbor-test/tiny-{kind}-GGUF",
                         {f"tiny-{kind}-F32.gguf": path.read_bytes()},
                         downloads=10, trending=float(len(kind)))
        hub.add_repo("someone/other-model", {"weights.bin": b"not gguf"}, downloads=999)
        yield hub


def test_search_finds_gguf_repositories_sorted_with_license(fake_hub: FakeHub) -> None:
    found = HubClient(Hub(fake_hub.url)).search("tiny", sort=SortOrder.DOWNLOADS, limit=10)
    assert found[0].repo == REPO  # most downloads first
    assert {f.repo for f in found} == {REPO} | {f"arbor-test/tiny-{k.value}-GGUF"
                                               for k in MemoryKind}
    assert found[0].license == "apache-2.0" and not found[0].gated
    asked = [r for r in fake_hub.requests if r.path == "/api/models"][-1].query
    assert asked["filter"] == ["gguf"] and asked["sort"] == ["downloads"]
    assert asked["search"] == ["tiny"]

    trending = HubClient(Hub(fake_hub.url)).search("tiny-", sort=SortOrder.TRENDING)
    assert trending[0].repo == "arbor-test/tiny-sliding_window-GGUF"


def test_search_is_cancellable_and_says_when_offline(fake_hub: FakeHub) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(HubCancelledError):
        HubClient(Hub(fake_hub.url)).search("tiny", cancel=cancel)
    with socket.socket() as s:  # a port nobody listens on: connection refused at once
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(HubOfflineError, match=r"cannot reach .* models already downloaded"):
        HubClient(Hub(closed)).search("tiny")


def test_details_group_quantizations_with_split_parts_sizes_and_sha256(
        fake_hub: FakeHub, tiny_models: dict[str, Path]) -> None:
    details = HubClient(Hub(fake_hub.url)).details(REPO)
    assert details.license == "apache-2.0" and not details.gated
    assert details.revision == fake_hub.repos[REPO].sha
    by_quant = {g.quant: g for g in details.groups}
    assert set(by_quant) == {"F32", "Q4_K_M"}  # the projector and the README are no models
    split = by_quant["Q4_K_M"]
    assert split.parts == 2 and split.complete
    assert [f.path.rsplit("-", 3)[-3] for f in split.files] == ["00001", "00002"]
    size = tiny_models["dense"].stat().st_size
    assert split.size == size and by_quant["F32"].size == size
    assert all(f.sha256 and len(f.sha256) == 64 for f in split.files)
    assert details.group(None).quant == "Q4_K_M"  # llama.cpp's default when none is named
    assert details.group("f32") is by_quant["F32"]
    with pytest.raises(HubNotFoundError, match=r"no single Q2_K .*F32"):
        details.group("Q2_K")


def test_an_unknown_repository_is_a_404_and_a_bad_name_never_asks(fake_hub: FakeHub) -> None:
    with pytest.raises(HubNotFoundError, match="no model repository arbor-test/missing"):
        HubClient(Hub(fake_hub.url)).details("arbor-test/missing")
    before = len(fake_hub.requests)
    for bad in ("no-slash", "a/b/c", "../etc", "a/b:Q4 K"):
        with pytest.raises(BadRepoNameError):
            parse_model_spec(bad)
    assert len(fake_hub.requests) == before
    assert parse_model_spec("unsloth/Qwen3-4B-GGUF:UD-Q4_K_XL") == (
        "unsloth/Qwen3-4B-GGUF", "UD-Q4_K_XL")
    assert parse_model_spec("https://huggingface.co/ggml-org/x-GGUF") == ("ggml-org/x-GGUF", None)


@pytest.mark.parametrize("kind", [k.value for k in MemoryKind])
def test_the_header_read_over_ranges_equals_the_local_read(
        fake_hub: FakeHub, tiny_models: dict[str, Path], kind: str) -> None:
    local = tiny_models[kind]
    remote = read_remote_header(Hub(fake_hub.url), f"arbor-test/tiny-{kind}-GGUF",
                                f"tiny-{kind}-F32.gguf")
    assert remote.fields == read_gguf_header(local, wanted_header_key)
    info = read_model_info(local)
    assert remote.summary.memory_kind is info.memory_kind is MemoryKind(kind)
    assert remote.summary.architecture == info.architecture
    assert remote.summary.context_length == info.context_length
    assert remote.summary.chat_template == info.chat_template is not None
    assert remote.size == local.stat().st_size
    assert remote.bytes_read < remote.size  # the header only, not the weights
    ranges = [r.range for r in fake_hub.cdn_requests()]
    assert ranges and all(r and r.startswith("bytes=") for r in ranges)


def test_fit_from_a_remote_header_fits_shrinks_the_context_or_refuses(
        fake_hub: FakeHub) -> None:
    client = HubClient(Hub(fake_hub.url))
    details = client.details(REPO)
    group = details.group("F32")
    header = client.header(details, group)
    assert group.size is not None
    weights = group.size
    shape = shape_of(header.fields)
    assert shape.memory_kind is MemoryKind.DENSE and shape.n_layer >= 1

    big = fit_of(header, weights, 8192, free_ram=64 << 30, checkpoint_budget=256 << 20)
    assert big.verdict is Verdict.FITS and big.n_ctx == 8192
    need = big.need
    assert need.total == need.weights + need.cache + need.compute + need.checkpoints
    # RAM for the need at 4096 tokens, not at 8192: a smaller context that fits is offered.
    at_4k = check_fit(shape, weights, 4096, free_ram=1 << 40, checkpoint_budget=0).need
    squeezed = fit_of(header, weights, 8192, free_ram=at_4k.total, checkpoint_budget=0)
    assert squeezed.verdict is Verdict.SMALLER_CONTEXT
    assert MIN_CONTEXT <= squeezed.n_ctx < 8192 and squeezed.need.total <= at_4k.total
    tiny = fit_of(header, weights, 8192, free_ram=weights // 2, checkpoint_budget=0)
    assert tiny.verdict is Verdict.DOES_NOT_FIT
    on_gpu = fit_of(header, weights, 8192, free_ram=1 << 30, free_vram=64 << 30,
                    checkpoint_budget=256 << 20)
    assert on_gpu.verdict is Verdict.FITS and on_gpu.all_on_gpu
    assert available_ram() > 0  # what the window passes as free_ram


def test_fit_counts_a_cache_per_memory_kind(fake_hub: FakeHub) -> None:
    """Dense caches grow with the context; a recurrent state does not; a sliding window
    stops growing at its window."""
    hub = Hub(fake_hub.url)
    grow = {}
    for kind in MemoryKind:
        header = read_remote_header(hub, f"arbor-test/tiny-{kind.value}-GGUF",
                                    f"tiny-{kind.value}-F32.gguf")
        shape = shape_of(header.fields)
        small = check_fit(shape, 0, 4096, free_ram=1 << 40, checkpoint_budget=0).need.cache
        large = check_fit(shape, 0, 16384, free_ram=1 << 40, checkpoint_budget=0).need.cache
        grow[kind] = (small, large)
    assert grow[MemoryKind.DENSE][1] == 4 * grow[MemoryKind.DENSE][0]
    assert grow[MemoryKind.RECURRENT][0] == grow[MemoryKind.RECURRENT][1] > 0
    assert grow[MemoryKind.SLIDING_WINDOW][0] == grow[MemoryKind.SLIDING_WINDOW][1] > 0
    assert grow[MemoryKind.HYBRID][0] < grow[MemoryKind.HYBRID][1]


@pytest.mark.parametrize(("name", "quant", "part", "parts"), [
    ("Qwen3-4B-Q4_K_M.gguf", "Q4_K_M", 1, 1),
    ("Model.Q8_0.gguf", "Q8_0", 1, 1),
    ("Model.i1-IQ2_XXS.gguf", "IQ2_XXS", 1, 1),
    ("rwkv7-2.9B-world-q4_k_m.gguf", "Q4_K_M", 1, 1),
    ("Qwen3-235B-A22B-UD-Q4_K_XL-00002-of-00003.gguf", "UD-Q4_K_XL", 2, 3),
    ("UD-IQ1_S/DeepSeek-R1-UD-IQ1_S-00001-of-00004.gguf", "UD-IQ1_S", 1, 4),
    ("gemma-3-1b-it-BF16.gguf", "BF16", 1, 1),
    ("Llama-3.2-3B-Instruct-IQ4_NL.gguf", "IQ4_NL", 1, 1),
    ("gpt-oss-20b-MXFP4.gguf", "MXFP4", 1, 1),
    ("plain-model.gguf", None, 1, 1),
])
def test_quantization_names(name: str, quant: str | None, part: int, parts: int) -> None:
    parsed = parse_gguf_name(name)
    assert parsed is not None
    assert (parsed.quant, parsed.part, parsed.parts) == (quant, part, parts)


def test_an_incomplete_split_model_is_not_offered() -> None:
    groups = group_files([RepoFile("m-Q8_0-00001-of-00002.gguf", 5),
                          RepoFile("m-Q4_K_M.gguf", 3)])
    assert [(g.quant, g.complete) for g in groups] == [("Q4_K_M", True), ("Q8_0", False)]
    assert pick_group(groups, "Q8_0") is None
    assert parse_gguf_name("notes.txt") is None


def test_the_recommended_list_covers_every_memory_kind_in_two_sizes() -> None:
    models = load_recommended()
    kinds = {m.memory_kind for m in models}
    assert kinds == set(MemoryKind)
    sizes = sorted(m.approx_gb for m in models if m.approx_gb)
    assert sizes[0] < 1.0 < 2.0 <= sizes[-1]
    for m in models:
        parse_model_spec(m.spec)
        assert m.size_bytes is None or m.size_bytes > 0
        assert m.sha256 is None or len(m.sha256) == 64
