"""Worker addresses: what the settings and `--rpc` accept (no RPC build needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.rpc import Endpoint, RpcError, parse_endpoint, parse_endpoints, probe
from engine.settings import Settings, SettingsError, load_settings


def test_addresses_parse_with_ipv6_in_brackets() -> None:
    assert parse_endpoint(" 10.0.0.5:50052 ") == Endpoint("10.0.0.5", 50052)
    assert str(parse_endpoint("[::1]:9")) == "[::1]:9"
    assert parse_endpoints("a:1, b:2") == (Endpoint("a", 1), Endpoint("b", 2))


@pytest.mark.parametrize("bad", ["host", ":80", "host:", "host:0", "host:70000", "h ost:1",
                                 "host:1x", "gpu-box:\u00b2", "gpu-box:\u0661\u0662",
                                 "gpu..lan:50052", ".lan:1", "x" * 64 + ".lan:1"])
def test_a_bad_address_is_refused_with_its_text(bad: str) -> None:
    with pytest.raises(RpcError, match=r"address|port"):
        parse_endpoint(bad)


def test_settings_refuse_bad_or_repeated_workers() -> None:
    with pytest.raises(SettingsError, match="not a worker address"):
        Settings(rpc_workers=("nowhere",))
    with pytest.raises(SettingsError, match="twice"):
        Settings(rpc_workers=("a:1", "a:1"))
    assert Settings.from_json({"rpc_workers": ["a:1"]}).rpc_workers == ("a:1",)


def test_a_settings_file_with_a_superscript_port_starts_on_the_defaults_and_says_why(
    tmp_path: Path,
) -> None:
    """It raised ValueError out of load_settings: the app could not start."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"rpc_workers": ["gpu-box:\u00b2"]}), encoding="utf-8")
    loaded = load_settings(path)
    assert loaded.settings == Settings() and loaded.problem and "port" in loaded.problem


def test_an_international_host_name_is_accepted() -> None:
    assert parse_endpoint("bücher.example:50052").host == "bücher.example"


def test_the_probe_names_why_a_worker_does_not_answer() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        why = probe(Endpoint("127.0.0.1", port), timeout=2)
    assert why is not None and "refused" in why.lower()


def test_the_probe_answers_in_words_for_a_name_the_resolver_cannot_take() -> None:
    """It raised UnicodeError ("an internal error stopped the load")."""
    assert probe(Endpoint("gpu..lan", 50052), timeout=2) is not None
