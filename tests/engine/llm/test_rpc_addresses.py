"""Worker addresses: what the settings and `--rpc` accept, and the probe that runs llama.cpp's
RPC handshake against fake workers (no RPC build needed)."""

from __future__ import annotations

import json
import re
import socket
import struct
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.window.main_window import MainWindow
from engine.config.endpoints import Endpoint, RpcError, parse_endpoint, parse_endpoints
from engine.config.params import RuntimeSettings
from engine.config.settings import Settings, SettingsError, load_settings
from engine.llm import rpc
from engine.llm.placement import place
from engine.llm.rpc import WorkersUnreachable, probe
from tests.app_fixtures import TIMEOUT


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


# --- the handshake, against fake workers ---------------------------------------------------

HELLO = bytes([14]) + (24).to_bytes(8, "little") + bytes(24)  # what llama.cpp sends first
SHORT_S = 0.2  # the probe's timeout in these tests: a silent worker costs this much


def answer(major: int, minor: int, patch: int) -> bytes:
    """A worker's HELLO response: its size, then version, padding and capabilities."""
    return struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24)


class FakeWorker:
    """A listening socket on 127.0.0.1 whose every connection `serve` handles, on a thread;
    what each connection sent first is kept in `received`."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = Endpoint("127.0.0.1", self._server.getsockname()[1])
        self.received: list[bytes] = []
        self.done = threading.Event()  # the test is over: let go of every connection
        self._serve = serve
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:  # closed: the test is over
                return
            with connection:
                self._serve(connection)

    def read_hello(self, connection: socket.socket) -> None:
        data = b""
        while len(data) < len(HELLO) and (chunk := connection.recv(len(HELLO) - len(data))):
            data += chunk
        self.received.append(data)

    def close(self) -> None:
        self.done.set()
        self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        self._server.close()
        self._thread.join()


@pytest.fixture
def fake_workers() -> Iterator[Callable[[Callable[[FakeWorker, socket.socket], None]],
                                         FakeWorker]]:
    made: list[FakeWorker] = []

    def make(serve: Callable[[FakeWorker, socket.socket], None]) -> FakeWorker:
        worker: FakeWorker
        worker = FakeWorker(lambda connection: serve(worker, connection))
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.close()


Make = Callable[[Callable[[FakeWorker, socket.socket], None]], FakeWorker]


def silent(worker: FakeWorker, _connection: socket.socket) -> None:
    """Accepts, and never answers (a worker busy with another client, or hung)."""
    worker.done.wait()


def answering(major: int, minor: int, patch: int) -> Callable[[FakeWorker, socket.socket], None]:
    def serve(worker: FakeWorker, connection: socket.socket) -> None:
        worker.read_hello(connection)
        connection.sendall(answer(major, minor, patch))
    return serve


def test_a_worker_that_answers_the_handshake_with_this_version_passes(fake_workers: Make) -> None:
    worker = fake_workers(answering(7, 0, 3))  # any patch version goes
    assert probe(worker.endpoint, timeout=5) is None
    assert worker.received == [HELLO]  # llama.cpp's own first message, byte for byte


def test_a_silent_worker_fails_the_probe_on_its_timeout_not_a_hang(fake_workers: Make) -> None:
    """It accepts the connection and never answers: llama.cpp would wait for ever."""
    worker = fake_workers(silent)
    why = probe(worker.endpoint, timeout=SHORT_S)
    assert why is not None and "did not answer the handshake within 0.2 s" in why


@pytest.mark.parametrize(("version", "said"), [
    ((6, 0, 0), "speaks RPC protocol 6.0.0, this llama.cpp 7.0"),
    ((8, 0, 0), "speaks RPC protocol 8.0.0, this llama.cpp 7.0"),
    ((7, 1, 0), "speaks RPC protocol 7.1.0, this llama.cpp 7.0"),  # newer minor: refused too
])
def test_a_worker_of_another_protocol_version_fails_the_probe_and_says_which(
    fake_workers: Make, version: tuple[int, int, int], said: str
) -> None:
    worker = fake_workers(answering(*version))
    why = probe(worker.endpoint, timeout=5)
    assert why is not None and said in why


def test_a_worker_that_closes_at_the_handshake_or_answers_oddly_fails_the_probe(
    fake_workers: Make,
) -> None:
    """What an older worker does with a HELLO of another size: it hangs up."""
    hangs_up = fake_workers(lambda worker, connection: worker.read_hello(connection))
    why = probe(hangs_up.endpoint, timeout=5)
    assert why is not None and "closed the connection at the handshake" in why

    def short(worker: FakeWorker, connection: socket.socket) -> None:
        worker.read_hello(connection)
        connection.sendall(struct.pack("<Q", 2) + b"\x07\x00")

    odd = fake_workers(short)
    why = probe(odd.endpoint, timeout=5)
    assert why is not None and "answered the handshake with 2 bytes" in why


def test_a_silent_worker_fails_the_load_with_a_message_that_names_it(
    fake_workers: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before llama.cpp is given it (the model file is not even read)."""
    monkeypatch.setattr(rpc, "PROBE_TIMEOUT_S", SHORT_S)
    worker = fake_workers(silent)
    good = fake_workers(answering(7, 0, 0))
    settings = RuntimeSettings(rpc_workers=(str(good.endpoint), str(worker.endpoint)))
    with pytest.raises(WorkersUnreachable) as raised:
        place(Path("never-read.gguf"), settings)
    assert raised.value.endpoints == (str(worker.endpoint),)
    message = str(raised.value)
    assert f"{worker.endpoint} (accepted the connection but did not answer" in message
    assert "does not answer as this llama.cpp's worker" in message


def test_a_worker_this_process_holds_a_connection_to_is_not_asked_again(
    fake_workers: Make,
) -> None:
    """A worker serves one client at a time: while a loaded model of this process is on it,
    its handshake would wait on that model's connection (a reload with workers)."""
    worker = fake_workers(silent)
    rpc.hold([worker.endpoint])
    try:
        assert probe(worker.endpoint, timeout=SHORT_S) is None
    finally:
        rpc.release([worker.endpoint])
    assert probe(worker.endpoint, timeout=SHORT_S) is not None


def test_the_handshake_constants_are_the_bundled_llama_cpps() -> None:
    """The probe speaks the protocol of the llama.cpp llama-cpp-python vendors: checked
    against its sdist (which `make` keeps) when it is at hand."""
    try:
        sdist = rpc.find_sdist(rpc.llama_cpp_version())
    except RpcError as exc:
        pytest.skip(str(exc))
    prefix = sdist.name.removesuffix(".tar.gz") + "/vendor/llama.cpp/ggml/"
    with tarfile.open(sdist) as archive:
        def read(name: str) -> str:
            member = archive.extractfile(prefix + name)
            assert member is not None
            return member.read().decode()

        header = read("include/ggml-rpc.h")
        source = read("src/ggml-rpc/ggml-rpc.cpp")
        transport = read("src/ggml-rpc/transport.h")
    assert re.search(rf"RPC_PROTO_MAJOR_VERSION\s+{rpc.RPC_PROTO_MAJOR}\b", header)
    assert re.search(rf"RPC_PROTO_MINOR_VERSION\s+{rpc.RPC_PROTO_MINOR}\b", header)
    assert f"RPC_CMD_HELLO == {rpc.RPC_CMD_HELLO}" in source
    assert f"RPC_CONN_CAPS_SIZE = {rpc.RPC_CONN_CAPS_SIZE};" in transport
    hello = source[source.index("struct rpc_msg_hello_rsp {"):]
    assert re.match(r"struct rpc_msg_hello_rsp \{\s*uint8_t major;\s*uint8_t minor;\s*"
                    r"uint8_t patch;\s*uint8_t padding;\s*uint8_t conn_caps\[", hello)


def test_in_the_window_a_silent_worker_is_left_out_and_named_not_loading_for_ever(
    qtbot: QtBot, thread_window: MainWindow, fake_workers: Make,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rpc, "PROBE_TIMEOUT_S", SHORT_S)  # the engine runs on a thread here
    window = thread_window
    worker = fake_workers(silent)
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT):
        window.models.apply_settings(replace(window.settings,
                                             rpc_workers=(str(worker.endpoint),)))
    model = window.replies.model
    assert model is not None and "RPC" not in model.backend
    assert any(str(worker.endpoint) in notice and "did not answer the handshake" in notice
               for notice in model.notices)
