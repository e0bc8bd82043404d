"""Worker addresses: what the settings and `--rpc` accept (no RPC build needed)."""

from __future__ import annotations

import pytest

from engine.rpc import Endpoint, RpcError, parse_endpoint, parse_endpoints, probe
from engine.settings import Settings, SettingsError


def test_addresses_parse_with_ipv6_in_brackets() -> None:
    assert parse_endpoint(" 10.0.0.5:50052 ") == Endpoint("10.0.0.5", 50052)
    assert str(parse_endpoint("[::1]:9")) == "[::1]:9"
    assert parse_endpoints("a:1, b:2") == (Endpoint("a", 1), Endpoint("b", 2))


@pytest.mark.parametrize("bad", ["host", ":80", "host:", "host:0", "host:70000", "h ost:1",
                                 "host:1x"])
def test_a_bad_address_is_refused_with_its_text(bad: str) -> None:
    with pytest.raises(RpcError, match=r"address|port"):
        parse_endpoint(bad)


def test_settings_refuse_bad_or_repeated_workers() -> None:
    with pytest.raises(SettingsError, match="not a worker address"):
        Settings(rpc_workers=("nowhere",))
    with pytest.raises(SettingsError, match="twice"):
        Settings(rpc_workers=("a:1", "a:1"))
    assert Settings.from_json({"rpc_workers": ["a:1"]}).rpc_workers == ("a:1",)


def test_the_probe_names_why_a_worker_does_not_answer() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        why = probe(Endpoint("127.0.0.1", port), timeout=2)
    assert why is not None and "refused" in why.lower()
