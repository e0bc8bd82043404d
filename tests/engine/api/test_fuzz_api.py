"""Fuzzing the local API with what any process on the machine (or a web page) can send: odd
methods and paths, Host, Origin, Content-Type and Content-Length that disagree with the
request, bodies of random bytes, random JSON and chat requests with wrong types, huge
numbers and odd text. The server (one per module, on a real engine) answers every request,
never with a 500, every 4xx with an OpenAI error body, logs no error, and goes on serving."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.api.guard import ConnectionLimits
from engine.config.settings import Settings
from tests.engine.api.test_api_server import TIMEOUT, serving
from tests.engine.config.test_fuzz_settings import json_values

# `serving` runs the API on its own engine process.
pytestmark = pytest.mark.engine_process

FUZZ = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
PORT = b"{port}"  # stands for the server's port in a drawn request
CHAT = b"/v1/chat/completions"


@dataclass(frozen=True)
class Api:
    port: int
    url: str


@pytest.fixture(scope="module")
def api(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Api]:
    home = tmp_path_factory.mktemp("fuzz-api")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ARBOR_HOME", str(home / "arbor-home"))
        # A small context: a request the model answers without a limit ends soon. A body
        # shorter than its Content-Length is answered 408 after half a second.
        with serving(tiny_models["dense"], home / "a.db",
                     settings=Settings(n_ctx=256, max_tokens=4, disk_tier=False),
                     limits=ConnectionLimits(body_timeout_s=0.5)) as (server, _client):
            yield Api(server.port, server.url)


# --- what is sent -------------------------------------------------------------------------

odd_text = st.text(max_size=30) | st.sampled_from([
    "\ud800", "\x00", "\u202e\u2066rtl", "\U0001f600" * 20, "\u2028\u2029", "a\r\nb",
    "<|im_end|>", "<|endoftext|>", "{{ raise_exception('x') }}", "river " * 2000, "",
])
hostile_numbers = st.sampled_from([0, -1, 10**40, -(10**40), 1e308, float("inf"),
                                   float("nan"), "4", True, None, [4], 4.5, 2**31, 2**63])


def usually(usual: st.SearchStrategy[Any], others: st.SearchStrategy[Any]
            ) -> st.SearchStrategy[Any]:
    """`usual` three times in four: most requests get past the checks in front of the one
    they fuzz."""
    return st.sampled_from([True, True, True, False]).flatmap(
        lambda plain: usual if plain else others)


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Chat requests, most of them nearly right. Any that the model answers has a small
    max_tokens or none (the 256-token context then ends it)."""
    user = st.fixed_dictionaries({"role": st.just("user"), "content": odd_text})
    message = usually(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                               "content": odd_text}),
        st.fixed_dictionaries({
            "role": st.sampled_from(["system", "developer", "tool", "", "USER"]) | json_values,
            "content": odd_text | json_values | st.lists(st.fixed_dictionaries({
                "type": st.sampled_from(["text", "image_url"]),
                "text": odd_text | json_values}), max_size=3)}))
    messages: Any = draw(st.lists(message, max_size=3))
    if draw(usually(st.just(True), st.just(False))):  # the model may answer it
        messages.append(draw(user))
    if draw(st.integers(0, 7)) == 0:
        messages = draw(json_values)
    body: dict[str, Any] = {"messages": messages,
                            "max_tokens": draw(usually(st.integers(1, 4), hostile_numbers))}
    optional = {
        "model": st.sampled_from(["", "tiny-dense", "gpt-4o"]) | json_values,
        "stream": st.booleans() | json_values,
        "stream_options": st.fixed_dictionaries({"include_usage": json_values})
        | json_values,
        "temperature": st.floats(0, 2) | hostile_numbers,
        "top_p": st.floats(0, 1) | hostile_numbers,
        "seed": st.integers() | hostile_numbers,
        "stop": odd_text | st.lists(odd_text, max_size=6) | json_values,
        "n": hostile_numbers | st.just(1),
        "max_completion_tokens": st.sampled_from([0, -3, 10**40, "x", 2.5]),
        "tools": json_values,
        "response_format": st.just({"type": "text"}) | json_values,
    }
    for key in draw(usually(st.just([]), st.lists(st.sampled_from(sorted(optional)),
                                                  min_size=1, max_size=3, unique=True))):
        body[key] = draw(optional[key])
    if draw(st.booleans()):
        body[draw(st.text(max_size=8))] = draw(json_values)
    return body


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8", "surrogatepass")


bodies = usually(chat_bodies().map(_dump), st.binary(max_size=300) | json_values.map(_dump)
                 | st.sampled_from([b"", b"{", b"[" * 5000, b'{"messages": ' * 100, b"\xff\xfe{}",
                                   b'{"a": 1, "a": 2}', b"NaN", b"\x00" * 50]))
header_value = st.binary(max_size=40).map(
    lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b"\x00", b"").strip())
header_name = st.from_regex(rb"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}", fullmatch=True)


@dataclass(frozen=True)
class Raw:
    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    def bytes_for(self, port: int) -> bytes:
        head = [self.method + b" " + self.target + b" HTTP/1.1"]
        head += [name + b": " + value.replace(PORT, str(port).encode())
                 for name, value in self.headers]
        return b"\r\n".join(head) + b"\r\n\r\n" + self.body


@st.composite
def requests(draw: st.DrawFn) -> Raw:
    method = draw(usually(st.just(b"POST"), st.sampled_from([
        b"GET", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE", b"CONNECT"])
        | st.from_regex(rb"[A-Z]{1,12}", fullmatch=True)))
    target = draw(usually(st.just(CHAT), st.sampled_from([
        b"/v1/models", b"/arbor/stats", b"/", b"*", b"/v1/chat/completions/", b"//v1/models",
        b"/v1/../v1/models", b"/v1/chat%2Fcompletions", b"/v1/models?x=%ff&y",
        b"http://evil.example/v1/models", b"/" + b"a" * 20000])
        | st.binary(min_size=1, max_size=40).map(
            lambda b: b"/" + bytes(c for c in b if 0x21 <= c <= 0x7e))))
    headers: list[tuple[bytes, bytes]] = []
    host = draw(usually(st.just(b"127.0.0.1:" + PORT), st.sampled_from([
        b"localhost:" + PORT, b"127.0.0.1", b"attacker.example", b"[::1]", b"", None,
        b"LOCALHOST", b"127.0.0.1:" + PORT + b"\xc3\xa9"]) | header_value))
    if host is not None:
        headers.append((b"host", host))
    origin = draw(usually(st.just(None), st.sampled_from([b"null", b"https://evil.example"])))
    if origin is not None:
        headers.append((b"origin", origin))
    kind = draw(usually(st.just(b"application/json"), st.sampled_from([
        b"application/json; charset=utf-8", b"APPLICATION/JSON", b"text/plain", None,
        b"multipart/form-data; boundary=x", b";"]) | header_value))
    if kind is not None:
        headers.append((b"content-type", kind))
    body = draw(bodies)
    size = draw(st.sampled_from(["right"] * 20 + ["none", "short", "long", "twice", "junk",
                                                  "huge", "chunked"]))
    if size == "chunked":
        cut = draw(st.integers(0, len(body)))
        parts = [p for p in (body[:cut], body[cut:]) if p]
        headers.append((b"transfer-encoding", b"chunked"))
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    elif size != "none":
        declared = {"right": len(body), "short": max(0, len(body) - 3), "long": len(body) + 5,
                    "huge": 10**7}.get(size)
        values = ([str(declared).encode()] if declared is not None else
                  [b"12", b"13"] if size == "twice" else [b"-1"])
        headers += [(b"content-length", v) for v in values]
    if draw(st.booleans()):
        headers.append((b"authorization", draw(header_value)))
    if draw(st.booleans()):
        headers.append((draw(header_name), draw(header_value)))
    if draw(st.integers(0, 9)) == 0:
        headers.append((b"expect", b"100-continue"))
    headers.append((b"connection", b"close"))
    draw(st.randoms()).shuffle(headers)
    return Raw(method, target, tuple(headers), body)


# --- what comes back ------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


def exchange(port: int, data: bytes) -> bytes:
    """Send `data` (which asks to close the connection) and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


def first_answer(data: bytes, head_only: bool) -> Answer:
    """The first final response in `data` (a 100 Continue skipped)."""
    while True:
        assert data.startswith(b"HTTP/1.1 "), data[:200]
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        headers = {name.strip().lower(): value.strip() for name, _, value in
                   (line.partition(b":") for line in lines[1:])}
        if status >= 200:
            break
        data = rest
    if head_only:
        return Answer(status, headers, b"")
    if b"content-length" in headers:
        return Answer(status, headers, rest[:int(headers[b"content-length"])])
    if headers.get(b"transfer-encoding") == b"chunked":
        body = b""
        while True:
            size, _, rest = rest.partition(b"\r\n")
            length = int(size, 16)
            if length == 0:
                return Answer(status, headers, body)
            body, rest = body + rest[:length], rest[length + 2:]
    return Answer(status, headers, rest)


def server_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records
            if r.levelno >= logging.ERROR]


@FUZZ
@given(request=requests())
def test_any_request_gets_an_answer_never_a_500_and_every_refusal_is_an_openai_error(
    api: Api, caplog: pytest.LogCaptureFixture, request: Raw
) -> None:
    caplog.set_level(logging.WARNING)
    answer = first_answer(exchange(api.port, request.bytes_for(api.port)),
                          head_only=request.method == b"HEAD")
    event(f"answered {answer.status}")
    assert answer.status < 500, answer
    if 400 <= answer.status < 500 and request.method != b"HEAD":
        assert answer.headers[b"content-type"].startswith(b"application/json"), answer
        error = json.loads(answer.body)["error"]
        assert isinstance(error["message"], str) and error["message"], answer
    assert server_logs(caplog) == []


def test_the_server_still_answers_a_normal_client_after_the_fuzzing(api: Api) -> None:
    with httpx.Client(timeout=TIMEOUT) as client:
        assert client.get(api.url + "/models").status_code == 200
        answer = client.post(api.url + "/chat/completions", json={
            "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 4})
        assert answer.status_code == 200, answer.text[:200]
        assert answer.json()["choices"][0]["message"]["role"] == "assistant"
