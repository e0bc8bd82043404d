"""The local API inside the app: the window's engine and the window's trees."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from openai import OpenAI
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.state.api_server import API_REQUEST_IDS, WindowEngine
from app.state.engine_client import ProcessEngine
from app.window.main_window import MainWindow
from engine.api.trees import ApiTrees
from engine.core.tree import NodeStatus, Role
from engine.service.client import EngineClient
from engine.service.protocol import GenerateRequest, Request
from engine.storage.transfer import FileFormat
from tests.app_fixtures import TIMEOUT, free_port, send, warnings_shown

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello API"}]


def serve(window: MainWindow, **extra: Any) -> str:
    window.models.apply_settings(replace(window.settings, api_server=True,
                                         api_port=free_port(), **extra))
    assert window.api.url is not None and window.api.problem is None
    return window.api.url


def in_thread(qtbot: QtBot, call: Any) -> Any:
    """Run a client call off the GUI thread (the API needs the GUI thread for its trees)
    and wait for it with the event loop running."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    qtbot.waitUntil(lambda: not thread.is_alive(), timeout=TIMEOUT)
    if "error" in out:
        raise out["error"]
    return out["value"]


def ask(url: str, messages: list[dict[str, str]], **extra: Any) -> Any:
    client = OpenAI(base_url=url, api_key=extra.pop("key", "none"), max_retries=0,
                    timeout=TIMEOUT / 1000)
    try:
        return client.chat.completions.create(model="", messages=messages,  # type: ignore[arg-type]
                                              temperature=0.0, max_tokens=8, **extra)
    finally:
        client.close()


def test_the_api_answers_with_the_windows_engine_and_its_trees_show_in_the_sidebar(
    qtbot: QtBot, window: MainWindow
) -> None:
    url = serve(window)
    assert window.status.api_label.text() == f"API: {url}"
    first = in_thread(qtbot, lambda: ask(url, MESSAGES))
    assert first.choices[0].message.content and first.usage.prompt_tokens > 0
    listed = {info.title: info.id for info in window.controller.listing()[0]}
    assert "API: Hello API" in listed
    # Opened in the window, the conversation is the API's tree: a swipe shows up in it.
    window.controller.open_conversation(listed["API: Hello API"])
    swipe = in_thread(qtbot, lambda: ask(url, MESSAGES))
    assert swipe.usage.prompt_tokens_details.cached_tokens > 0
    user = window.tree.node(window.tree.root.children[0])
    assert user.role is Role.USER and len(user.children) == 2
    stored = window.store.load(listed["API: Hello API"])
    assert len(stored.node(stored.root.children[0]).children) == 2


def test_an_api_client_learns_nothing_of_the_windows_conversations_from_the_cache(
    qtbot: QtBot, window: MainWindow
) -> None:
    """The window's cache was every API client's: a request with the text of a note the
    window had just answered came back with most of its prompt cached. The window's state
    is its own scope; an API client's `cached_tokens` counts only its own."""
    url = serve(window)
    note = "My private note: the vault code is 4417, the spare key is behind the atlas."
    send(qtbot, window, note)
    messages = [{"role": "user", "content": note}]
    if window.tree.root.text:
        messages.insert(0, {"role": "system", "content": window.tree.root.text})
    guess = in_thread(qtbot, lambda: ask(url, messages))
    assert guess.usage.prompt_tokens > 20
    assert guess.usage.prompt_tokens_details.cached_tokens == 0
    again = in_thread(qtbot, lambda: ask(url, messages))  # its own request: its own state
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_the_window_goes_first_and_both_replies_are_kept(
    qtbot: QtBot, window: MainWindow
) -> None:
    url = serve(window)
    window.models.apply_settings(replace(window.settings, max_tokens=200))
    order: list[str] = []
    window.reply_finished.connect(lambda: order.append("window"))
    window.composer.setPlainText("A long answer, please.")
    qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    assert window.replies.streaming is not None  # the window's reply is under way
    result: dict[str, Any] = {}

    def client() -> None:
        result["api"] = ask(url, MESSAGES)
        order.append("api")

    thread = threading.Thread(target=client)
    thread.start()
    qtbot.waitUntil(lambda: not thread.is_alive(), timeout=TIMEOUT)
    assert order[:2] == ["window", "api"]
    assert result["api"].choices[0].message.content
    assert window.tree.messages()[-1].role is Role.ASSISTANT
    send(qtbot, window, "And the window still answers.")


def test_turning_the_setting_off_stops_the_server_and_a_taken_port_is_reported(
    qtbot: QtBot, window: MainWindow
) -> None:
    url = serve(window, api_key="k3y")
    with pytest.raises(openai.AuthenticationError):
        in_thread(qtbot, lambda: ask(url, MESSAGES, key="wrong"))
    assert in_thread(qtbot, lambda: ask(url, MESSAGES, key="k3y")).choices
    window.models.apply_settings(replace(window.settings, api_server=False))
    assert window.api.url is None and not window.status.api_label.isVisible()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/models", timeout=5)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        window.models.apply_settings(replace(window.settings, api_server=True, api_port=port))
        assert window.api.url is None and window.api.problem is not None
        assert f"port {port} cannot be used" in window.status.api_label.text()


# --- the window and the API on one engine: each stops its own reply, the window goes first --


class ApiTraffic:
    """What goes from the API to the engine: its reply sent, its reply stopped (by the
    API's worker thread, whatever the call's arguments)."""

    def __init__(self, engine: EngineClient, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent = threading.Event()
        self.stopped = threading.Event()
        send_request, stop = engine.send, engine.stop

        def sending(request: Request) -> None:
            send_request(request)
            if isinstance(request, GenerateRequest) and request.request_id >= API_REQUEST_IDS:
                self.sent.set()

        def stopping(*args: Any) -> None:
            stop(*args)
            if threading.current_thread().name == "arbor-api-worker":
                self.stopped.set()

        monkeypatch.setattr(engine, "send", sending)
        monkeypatch.setattr(engine, "stop", stopping)


def _api_behind_the_windows_reply(qtbot: QtBot, window: MainWindow,
                                  monkeypatch: pytest.MonkeyPatch) -> tuple[str, ApiTraffic]:
    """The window's long reply streams and an API request will be queued in the engine
    behind it: what happens when the window starts its reply just after the API saw it had
    none (`wait_turn` returned), made certain by letting the API's turn come at once."""
    url = serve(window)
    window.models.apply_settings(replace(window.settings, max_tokens=2048, seed=7))
    monkeypatch.setattr(WindowEngine, "wait_turn", lambda _self, _cancel: None)
    assert isinstance(window.engine, ProcessEngine)
    traffic = ApiTraffic(window.engine.client, monkeypatch)
    window.composer.setPlainText("A long answer, please.")
    with qtbot.waitSignal(window.text_shown, timeout=TIMEOUT):
        qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    return url, traffic


def test_a_client_that_goes_away_stops_its_reply_and_never_the_windows(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, traffic = _api_behind_the_windows_reply(qtbot, window, monkeypatch)
    failed: list[str] = []
    window.replies.reply_failed.connect(failed.append)
    address = urlsplit(url)
    body = json.dumps({"messages": MESSAGES, "max_tokens": 8}).encode()
    client = socket.create_connection((address.hostname, address.port))
    client.sendall(f"POST {address.path}/chat/completions HTTP/1.1\r\n"
                   f"Host: {address.netloc}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    qtbot.waitUntil(traffic.sent.is_set, timeout=TIMEOUT)  # queued behind the window's
    client.close()  # the client goes away
    qtbot.waitUntil(traffic.stopped.is_set, timeout=TIMEOUT)  # its reply is stopped...
    qtbot.waitUntil(lambda: window.replies.streaming is None, timeout=TIMEOUT)
    reply = window.tree.node(window.tree.active_leaf)  # ...and the window's is not
    assert reply.role is Role.ASSISTANT and reply.status is NodeStatus.COMPLETE, failed
    assert failed == []
    assert window.replies.last_reply is not None
    assert window.replies.last_reply.generated_tokens == 2048
    assert in_thread(qtbot, lambda: ask(url, MESSAGES)).choices[0].message.content


def test_the_users_esc_stops_the_windows_reply_and_never_the_apis(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, traffic = _api_behind_the_windows_reply(qtbot, window, monkeypatch)
    result: dict[str, Any] = {}

    def client() -> None:
        try:
            result["api"] = ask(url, MESSAGES)
        except Exception as exc:
            result["api"] = exc

    thread = threading.Thread(target=client)
    thread.start()
    qtbot.waitUntil(traffic.sent.is_set, timeout=TIMEOUT)  # queued behind the window's
    qtbot.keyClick(window.composer, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not thread.is_alive(), timeout=TIMEOUT)
    reply = window.tree.node(window.tree.active_leaf)
    assert reply.role is Role.ASSISTANT and reply.status is NodeStatus.INTERRUPTED
    answer = result["api"]
    assert not isinstance(answer, Exception), answer
    assert answer.choices[0].message.content and answer.usage.completion_tokens == 8


def test_the_users_message_stops_a_long_api_reply_whose_client_is_told_why(
    qtbot: QtBot, window: MainWindow
) -> None:
    url = serve(window)
    lines: list[str] = []
    streaming = threading.Event()

    def client() -> None:
        body = {"messages": [{"role": "user", "content": "Go on forever"}],
                "max_tokens": 4000, "stream": True}
        with httpx.stream("POST", url + "/chat/completions", json=body,
                          timeout=TIMEOUT / 1000) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    lines.append(line.removeprefix("data:").strip())
                    if '"content": "' in line and '"content": ""' not in line:
                        streaming.set()

    thread = threading.Thread(target=client)
    thread.start()
    qtbot.waitUntil(streaming.is_set, timeout=TIMEOUT)  # the API's reply is under way
    qtbot.keyClick(window.composer, Qt.Key.Key_Escape)  # the window has none: nothing stops
    send(qtbot, window, "My turn, please.")  # would wait for all 4000 tokens if not first
    reply = window.tree.node(window.tree.active_leaf)
    assert reply.role is Role.ASSISTANT and reply.status is NodeStatus.COMPLETE
    qtbot.waitUntil(lambda: not thread.is_alive(), timeout=TIMEOUT)
    assert lines[-1] == "[DONE]"
    assert "error" in json.loads(lines[-2]), lines[-2]  # in-band, OpenAI's way
    error = json.loads(lines[-2])["error"]
    assert error["code"] == "preempted" and "needs the model" in error["message"]
    # What its client was sent is kept (one failure policy for every front end: no text
    # streamed to a user is lost): its conversation, the reply interrupted. The API goes on.
    listed = {info.title: info.id for info in window.controller.listing()[0]}
    kept = window.store.load(listed["API: Go on forever"])
    reply = kept.node(kept.node(kept.root.children[0]).children[0])
    assert reply.status is NodeStatus.INTERRUPTED and reply.text
    assert in_thread(qtbot, lambda: ask(url, MESSAGES)).choices[0].message.content


def test_an_engine_that_dies_after_the_api_saw_it_loaded_answers_503_and_comes_back(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine dies after the API's `loaded()` check, and its reader has handed the
    death on, before the API's request is sent (the window has not restarted it yet: the
    kill happens on the GUI thread, while the API places its request in its tree)."""
    shown = warnings_shown(monkeypatch)
    url = serve(window)
    begin = ApiTrees.begin

    def begin_then_die(self: ApiTrees, *args: Any) -> Any:
        monkeypatch.setattr(ApiTrees, "begin", begin)  # once
        begun = begin(self, *args)
        readers = [t for t in threading.enumerate() if t.name == "arbor-engine-events"]
        assert isinstance(window.engine, ProcessEngine)
        window.engine.kill()
        for reader in readers:
            reader.join()  # the death is handed to the taps (none yet) and on to the window
        return begun

    monkeypatch.setattr(ApiTrees, "begin", begin_then_die)
    with (qtbot.waitSignal(window.model_ready, timeout=TIMEOUT),  # the window reloads it
          pytest.raises(openai.InternalServerError) as failed):
        in_thread(qtbot, lambda: ask(url, MESSAGES))
    assert failed.value.status_code == 503 and "engine process ended" in str(failed.value)
    assert len(shown) == 1 and "killed" in shown[0]
    assert in_thread(qtbot, lambda: ask(url, MESSAGES)).choices[0].message.content


def test_an_api_requests_checkpoints_are_shown_exported_and_freed_with_its_conversation(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    """The window's API sent its nodes' ids without their conversation's: the engine kept
    the checkpoints of API replies under ids of no conversation, so the window never showed
    them on the API's conversation, never exported them with it, never freed them with its
    branches."""
    url = serve(window)
    in_thread(qtbot, lambda: ask(url, MESSAGES))
    cid = {info.title: info.id for info in window.controller.listing()[0]}["API: Hello API"]
    tree = window.store.load(cid)
    user = tree.node(tree.root.children[0])
    branch = {user.id, *user.children}
    # Shown: the engine's figures name the API conversation's own nodes (before the window
    # opens it, so none of the window's warm-ups is among them).
    qtbot.waitUntil(lambda: bool(set(window.replies.marks.get(cid, {})) & branch),
                    timeout=TIMEOUT)
    window.controller.open_conversation(cid)
    window.replies._warm_timer.stop()
    # Exported with it.
    out = tmp_path / "api.arbor"
    with qtbot.waitSignal(window.files.export_finished, timeout=TIMEOUT) as exported:
        window.files.export_current(out, FileFormat.NATIVE)
    assert exported.args[0].error is None and exported.args[0].checkpoints >= 1
    # Freed with its branch.
    window.controller.delete_branch(user.id)
    qtbot.waitUntil(lambda: not set(window.replies.marks.get(cid, {})) & branch,
                    timeout=TIMEOUT)
