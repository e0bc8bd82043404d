"""The local API inside the app: the window's engine and the window's trees."""

from __future__ import annotations

import socket
import threading
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.main_window import MainWindow
from engine.tree import Role
from tests.app_fixtures import TIMEOUT, free_port, send

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
