"""Settings: validated values, a file that survives bad input, and what a change costs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.checkpoints import CheckpointStore
from engine.llama import FlashAttention
from engine.runtime import Runtime
from engine.settings import (
    Effect,
    Settings,
    SettingsError,
    Theme,
    effect_of,
    load_settings,
    save_settings,
    settings_path,
)
from tests.conftest import RuntimeFactory


def test_settings_round_trip_through_the_config_dir(_arbor_home: Path) -> None:
    chosen = Settings(n_ctx=2048, temperature=0.3, seed=42, theme=Theme.DARK,
                      flash_attn=FlashAttention.ON, type_v="q8_0", disk_tier=False,
                      model="/models/x.gguf")
    save_settings(chosen)
    assert settings_path().parent == _arbor_home / "config"
    loaded = load_settings()
    assert loaded.problem is None and loaded.settings == chosen


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

    monkeypatch.setattr("engine.settings.write_atomic", full)
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
    store = CheckpointStore(runtime.identity(), ram_budget=1, disk_dir=tmp_path)
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
