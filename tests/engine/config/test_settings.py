"""Settings: validated values, a file that survives bad input, and what a change costs."""

from __future__ import annotations

import json
import os
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest

from engine.config.mcp import McpServer, Transport
from engine.config.settings import (
    MAX_GPU_LAYERS,
    MAX_REPLY_TOKENS,
    MAX_SETTINGS_BYTES,
    Effect,
    Settings,
    SettingsError,
    Theme,
    effect_of,
    load_settings,
    save_settings,
    settings_path,
)
from engine.llm.llama import FlashAttention
from engine.llm.runtime import Runtime
from engine.storage.checkpoints import CheckpointStore
from tests.conftest import RuntimeFactory


def test_settings_round_trip_through_the_config_dir(_arbor_home: Path) -> None:
    chosen = Settings(n_ctx=2048, temperature=0.3, seed=42, theme=Theme.DARK,
                      flash_attn=FlashAttention.ON, type_v="q8_0", disk_tier=False,
                      model="/models/x.gguf")
    save_settings(chosen)
    assert settings_path().parent == _arbor_home / "config"
    loaded = load_settings()
    assert loaded.problem is None and loaded.settings == chosen


def test_mcp_servers_round_trip_and_apply_at_once(_arbor_home: Path) -> None:
    servers = (McpServer("files", command="npx", args=("-y", "@x/files", "/tmp"),
                         env={"TOKEN": "t"}, always_allowed=("read",)),
               McpServer("web", Transport.HTTP, url="https://example.com/mcp",
                         headers={"Authorization": "Bearer k"}, timeout_s=5, enabled=False))
    save_settings(Settings(mcp_servers=servers))
    loaded = load_settings()
    assert loaded.problem is None and loaded.settings.mcp_servers == servers
    assert effect_of(Settings(), loaded.settings) is Effect.LIVE


def test_a_missing_file_gives_the_defaults_quietly() -> None:
    assert load_settings() == load_settings()
    assert load_settings().settings == Settings() and load_settings().problem is None


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"n_ctx": "big"}', "n_ctx"),
        ('{"n_ctx": 10}', "context size"),
        ('{"temperature": true}', "temperature"),
        ('{"flash_attn": "sometimes"}', "flash_attn"),
        ('{"type_k": "q2_weird"}', "cache type"),
    ],
)
def test_a_bad_file_gives_defaults_with_the_reason_and_is_left_untouched(
    content: str, reason: str
) -> None:
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(content)
    loaded = load_settings()
    assert loaded.settings == Settings()
    assert loaded.problem is not None and reason in loaded.problem
    assert path.read_text() == content  # the user can still mend it by hand


def test_unknown_keys_from_a_newer_version_are_ignored() -> None:
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 9, "n_ctx": 8192, "telepathy": True}))
    loaded = load_settings()
    assert loaded.problem is None and loaded.settings.n_ctx == 8192


def test_impossible_combinations_are_refused_with_a_clear_message() -> None:
    with pytest.raises(SettingsError, match="needs flash attention"):
        Settings(type_v="q8_0", flash_attn=FlashAttention.OFF)
    with pytest.raises(SettingsError, match="top-p"):
        Settings(top_p=0.0)
    with pytest.raises(SettingsError, match="seed"):
        Settings(seed=-5)


def test_a_full_disk_leaves_the_old_file(monkeypatch: pytest.MonkeyPatch) -> None:
    save_settings(Settings(n_ctx=2048))
    before = settings_path().read_bytes()

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("engine.config.settings.write_atomic", full)
    with pytest.raises(SettingsError, match="No space left"):
        save_settings(Settings(n_ctx=8192))
    assert settings_path().read_bytes() == before


def test_what_each_change_costs() -> None:
    base = Settings()
    assert effect_of(base, base) is Effect.NONE
    for live in (dict(temperature=0.1), dict(seed=3), dict(checkpoint_ram_mib=512),
                 dict(disk_tier=False), dict(checkpoint_interval=1024), dict(theme=Theme.DARK)):
        assert effect_of(base, replace(base, **live)) is Effect.LIVE, live
    for reload in (dict(n_gpu_layers=-1), dict(n_threads=2)):
        assert effect_of(base, replace(base, **reload)) is Effect.RELOAD, reload
    for invalidate in (dict(n_ctx=8192), dict(flash_attn=FlashAttention.ON),
                       dict(type_k="q8_0")):
        assert effect_of(base, replace(base, **invalidate)) is Effect.INVALIDATE, invalidate


def test_the_invalidating_settings_are_exactly_those_in_the_checkpoint_identity(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory
) -> None:
    """What the dialog warns about must match what really makes a checkpoint unloadable."""
    base = Settings(n_ctx=512)

    def identity(settings: Settings) -> object:
        runtime: Runtime = make_runtime(tiny_models["dense"], **vars(settings.runtime()))
        return runtime.identity()

    reference = identity(base)
    for change in (dict(n_ctx=1024), dict(flash_attn=FlashAttention.ON), dict(type_k="q8_0"),
                   dict(n_threads=1), dict(temperature=0.2)):
        changed = replace(base, **change)
        differs = identity(changed) != reference
        assert differs == (effect_of(base, changed) is Effect.INVALIDATE), change


def test_turning_the_disk_tier_off_and_on_at_once(
    tiny_models: dict[str, Path], make_runtime: RuntimeFactory, tmp_path: Path
) -> None:
    runtime = make_runtime(tiny_models["recurrent"], n_ctx=256, n_batch=16)
    runtime.prepare(list(range(10, 40)))
    blob = runtime.capture()
    store = CheckpointStore(runtime.identity(), key=b"k" * 32, ram_budget=1, disk_dir=tmp_path)
    store.add(replace(blob, node_id=1))
    store.enforce_budget()  # over a 1-byte budget: spilled to disk
    assert store.stats().disk_count == 1 and store.stats().ram_count == 0
    files = list(tmp_path.rglob("*.ckpt"))
    assert len(files) == 1

    store.configure(ram_budget=1 << 30, disk_dir=None)
    assert len(store) == 0 and not files[0].exists()  # a disk-only checkpoint went with it

    store.add(replace(blob, node_id=2))
    store.configure(ram_budget=1, disk_dir=tmp_path)  # on again, and over budget: spilled
    assert store.stats().disk_count == 1 and len(list(tmp_path.rglob("*.ckpt"))) == 1
    assert store.fetch(store.all()[0]) is not None


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"model": "\xff\xfe"}', "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "deeper"),
        (b'{"n_ctx": ' + b"9" * 5000 + b"}", "digits"),
        (b'{"temperature": NaN}', "NaN"),
        (b'{"n_ctx": 2048, "n_ctx": 8192}', "twice"),
        (b'{"model": "\\ud800"}', "surrogate"),
        (b'{"model": "a\\u0000b"}', "model"),
        (b'{"n_ctx": 1e400}', "too large"),
        (b'{"n_ctx": ' + b"1" * 30 + b"}", "context size"),
        (b'{"mcp_servers": [{"name": "x", "command": ""}]}', "a command is needed"),
        (b'{"mcp_servers": [{"command": "x"}]}', "needs a name"),
        (b'{"mcp_servers": {"name": "x"}}', "list of MCP servers"),
        (b'{"mcp_servers": [{"name": "a", "command": "x"}, {"name": "A", "command": "y"}]}',
         "same name"),
        (b'{"mcp_servers": [{"name": "w", "transport": "http", "url": "file:///etc"}]}',
         "http://"),
        (b'{"model": ' + b'"x' + b"\\n\\u001b" * 100_000 + b'"}', "model"),
    ],
)
def test_any_file_gives_the_defaults_and_one_short_message(content: bytes, reason: str) -> None:
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    loaded = load_settings()
    assert loaded.settings == Settings()
    assert loaded.problem is not None and reason in loaded.problem
    assert "\n" not in loaded.problem and "\x1b" not in loaded.problem
    assert len(loaded.problem) < 1000
    assert path.read_bytes() == content


def test_a_fifo_or_a_folder_is_not_read() -> None:
    path = settings_path()
    path.parent.mkdir(parents=True)
    os.mkfifo(path)  # a read would wait for a writer forever
    loaded = load_settings()
    assert loaded.settings == Settings() and loaded.problem is not None
    path.unlink()
    path.mkdir()
    assert load_settings().problem is not None


def test_an_oversized_file_is_read_only_up_to_the_limit() -> None:
    path = settings_path()
    path.parent.mkdir(parents=True)
    with path.open("wb") as f:
        f.truncate(64 * MAX_SETTINGS_BYTES)  # sparse: 64 MiB that cost no disk
    tracemalloc.start()
    try:
        loaded = load_settings()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert loaded.settings == Settings() and loaded.problem is not None
    assert "larger than" in loaded.problem
    assert peak < 3 * MAX_SETTINGS_BYTES


def test_numbers_past_their_range_are_clamped_where_the_meaning_survives() -> None:
    """More GPU layers than any model has means every layer; more threads than cores, all
    cores; a longer reply than the longest, the longest. The rest of the file is used."""
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"n_ctx": 2048, "n_gpu_layers": 10**29, "n_threads": 10**6,
                                "max_tokens": 10**9}))
    loaded = load_settings()
    assert loaded.settings == Settings(n_ctx=2048, n_gpu_layers=-1, n_threads=0,
                                       max_tokens=MAX_REPLY_TOKENS)
    assert loaded.problem is not None and "GPU layers" in loaded.problem
    assert "\n" not in loaded.problem


def test_out_of_range_numbers_are_refused_in_code() -> None:
    with pytest.raises(SettingsError, match="GPU layers"):
        Settings(n_gpu_layers=10**30)  # would wrap in the C int llama.cpp takes
    with pytest.raises(SettingsError, match="GPU layers"):
        Settings(n_gpu_layers=MAX_GPU_LAYERS + 1)
    assert Settings(n_gpu_layers=MAX_GPU_LAYERS).n_gpu_layers == MAX_GPU_LAYERS


def test_an_automatic_save_leaves_a_set_aside_file_for_the_user_to_mend() -> None:
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text('{"n_ctx": 10}')
    assert not save_settings(Settings(model="/models/x.gguf"), automatic=True)
    assert path.read_text() == '{"n_ctx": 10}'
    assert save_settings(Settings(n_ctx=2048))  # the user's own save replaces it
    assert load_settings().settings == Settings(n_ctx=2048)
    assert save_settings(Settings(n_ctx=2048, model="/m.gguf"), automatic=True)
    assert load_settings().settings.model == "/m.gguf"
