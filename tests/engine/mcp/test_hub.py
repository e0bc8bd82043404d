"""The MCP hub against a real MCP server (tests/fixtures/mcp_server.py), over stdio and
streamable HTTP: listing, calls, a tool that fails, one that hangs past the timeout, a server
that dies mid-call, and the restart on demand after each."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.config.mcp import McpServer, Transport
from engine.mcp.hub import MAX_RESULT_CHARS, McpError, McpHub

SERVER = Path(__file__).parents[2] / "fixtures" / "mcp_server.py"
WAIT = 120  # seconds a future may take on a loaded machine before the test gives up


def stdio(name: str = "test", timeout_s: int = 30) -> McpServer:
    return McpServer(name, Transport.STDIO, command=sys.executable, args=(str(SERVER),),
                     timeout_s=timeout_s)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[McpHub]:
    made = McpHub([stdio(), stdio("quick", timeout_s=2)], log_dir=tmp_path)
    yield made
    made.close()


def test_lists_the_tools_with_their_schemas(hub: McpHub) -> None:
    tools = {t.name: t for t in hub.list_tools("test").result(WAIT)}
    assert {"add", "nap", "fail", "exit_now", "big", "whoami"} <= set(tools)
    add = tools["add"].to_openai()["function"]
    assert add["description"] == "Add two whole numbers."
    assert add["parameters"]["required"] == ["a", "b"]
    assert add["parameters"]["properties"]["a"]["type"] == "integer"


def test_a_call_answers_and_the_connection_is_kept(hub: McpHub) -> None:
    first = hub.call("test", "add", {"a": 2, "b": 3}).result(WAIT)
    assert (first.text, first.failed) == ("5", False)
    pid = hub.call("test", "whoami", {}).result(WAIT).text
    assert hub.running("test")
    assert hub.call("test", "whoami", {}).result(WAIT).text == pid  # the same process


def test_a_failing_tool_is_a_failed_result_the_model_reads(hub: McpHub) -> None:
    outcome = hub.call("test", "fail", {"why": "no"}).result(WAIT)
    assert outcome.failed
    assert "fail" in outcome.text
    assert hub.call("test", "add", {"a": 1, "b": 1}).result(WAIT).text == "2"  # still up


def test_a_hanging_tool_times_out_and_the_server_restarts_on_demand(hub: McpHub) -> None:
    before = hub.call("quick", "whoami", {}).result(WAIT).text
    outcome = hub.call("quick", "nap", {"seconds": 30}).result(WAIT)
    assert outcome.failed
    assert "did not answer within 2 s" in outcome.text
    assert not hub.running("quick")
    after = hub.call("quick", "whoami", {}).result(WAIT)
    assert not after.failed and after.text != before  # a new process


def test_a_server_that_dies_is_reported_and_restarted(hub: McpHub) -> None:
    before = hub.call("test", "whoami", {}).result(WAIT).text
    outcome = hub.call("test", "exit_now", {}).result(WAIT)
    assert outcome.failed
    assert "stopped" in outcome.text and "starts again" in outcome.text
    after = hub.call("test", "whoami", {}).result(WAIT)
    assert not after.failed and after.text != before


def test_a_long_result_is_cut_and_says_so(hub: McpHub) -> None:
    outcome = hub.call("test", "big", {"chars": MAX_RESULT_CHARS + 500}).result(WAIT)
    assert outcome.text.startswith("x" * MAX_RESULT_CHARS)
    assert outcome.text.endswith("[… 500 more characters were cut]")


def test_unknown_or_unstartable_servers_fail_with_a_reason(tmp_path: Path) -> None:
    broken = McpServer("broken", command=str(tmp_path / "no-such-program"), timeout_s=20)
    off = McpServer("off", command=sys.executable, enabled=False)
    hub = McpHub([broken, off], log_dir=tmp_path)
    try:
        outcome = hub.call("broken", "add", {}).result(WAIT)
        assert outcome.failed and "could not be started" in outcome.text
        assert "turned off" in hub.call("off", "add", {}).result(WAIT).text
        assert "no MCP server called" in hub.call("gone", "add", {}).result(WAIT).text
        with pytest.raises(McpError, match="could not be started"):
            hub.list_tools("broken").result(WAIT)
    finally:
        hub.close()


def test_a_changed_definition_restarts_that_server_only(hub: McpHub) -> None:
    pid = hub.call("test", "whoami", {}).result(WAIT).text
    quick = hub.call("quick", "whoami", {}).result(WAIT).text
    hub.configure([stdio(timeout_s=31), stdio("quick", timeout_s=2)])
    assert hub.call("test", "whoami", {}).result(WAIT).text != pid
    assert hub.call("quick", "whoami", {}).result(WAIT).text == quick


def test_streamable_http_with_headers(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, str(SERVER), "--http", "--token", "s3cret"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = f"http://127.0.0.1:{int(process.stdout.readline())}/mcp"
        good = McpServer("web", Transport.HTTP, url=url,
                         headers={"Authorization": "Bearer s3cret"})
        bad = McpServer("nokey", Transport.HTTP, url=url, timeout_s=20)
        hub = McpHub([good, bad], log_dir=tmp_path)
        try:
            assert "add" in {t.name for t in hub.list_tools("web").result(WAIT)}
            assert hub.call("web", "add", {"a": 40, "b": 2}).result(WAIT).text == "42"
            refused = hub.call("nokey", "add", {"a": 1, "b": 2}).result(WAIT)
            assert refused.failed and "could not be started" in refused.text
        finally:
            hub.close()
    finally:
        process.terminate()
        process.wait(30)


def test_definitions_are_checked() -> None:
    assert McpServer("", command="x").problems()
    assert McpServer("a", command=" ").problems()
    assert McpServer("a", Transport.HTTP, url="ftp://x").problems()
    assert McpServer("a", Transport.HTTP, url="http://h/mcp",
                     headers={"X": "a\r\nb"}).problems()
    assert McpServer("a", command="x", env={"1BAD": "v"}).problems()
    assert McpServer("a", command="x", timeout_s=0).problems()
    assert not McpServer("files", command="npx", args=("-y", "server")).problems()
    round_trip = McpServer.from_json(stdio().with_allowed("add").to_json())
    assert round_trip == stdio().with_allowed("add")
    assert round_trip.always_allowed == ("add",)
