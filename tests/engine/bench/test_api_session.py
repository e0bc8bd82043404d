"""The API session benchmark: what it sends (against a scripted OpenAI-style server that
records every request), how it reads what servers report, its medians and table; then the
real servers on a tiny model. No test here looks at a time's value."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from engine.bench import api_session
from engine.bench.api_session import (
    EDIT_BACK,
    EDIT_TEXT,
    RETURN_TEXT,
    Answer,
    Measure,
    Plan,
    Server,
    ServerChat,
    Step,
    ask,
    from_json,
    markdown,
    run_session,
    summarise,
    to_json,
)


class Scripted:
    """An OpenAI-style server: each reply is "reply N", streamed in three pieces; its usage
    counts words as tokens and reports the longest common prefix with the previous request
    as cached (in `usage` or, llama-server's way, in `timings`)."""

    def __init__(self, *, timings: bool = False, limit: int | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.timings = timings
        self.limit = limit  # prompts of more words are refused with 400, as over a context
        self._previous: list[str] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                body = json.dumps({"data": [{"id": "scripted-model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if scripted.refuses(request):
                    body = b'{"error": {"message": "the request exceeds the context"}}'
                    self.send_response(400)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for data in scripted.answer(request):
                    self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def refuses(self, request: dict[str, Any]) -> bool:
        words = " ".join(m["content"] for m in request["messages"]).split()
        return self.limit is not None and len(words) > self.limit

    def answer(self, request: dict[str, Any]) -> Iterator[str]:
        self.requests.append(request)
        words = " ".join(m["content"] for m in request["messages"]).split()
        cached = 0
        while cached < min(len(words), len(self._previous)) and \
                words[cached] == self._previous[cached]:
            cached += 1
        self._previous = words
        n = len(self.requests)
        for piece in (f"reply {n}", " and", " more"):
            yield json.dumps({"choices": [{"delta": {"content": piece}}]})
        usage: dict[str, Any] = {"prompt_tokens": len(words), "completion_tokens": 3}
        if self.timings:
            yield json.dumps({"choices": [], "usage": usage, "timings": {"cache_n": cached}})
        else:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
            yield json.dumps({"choices": [], "usage": usage})

    def __enter__(self) -> Scripted:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_session_swipes_edits_back_and_returns_to_the_first_branch() -> None:
    plan = Plan(lengths=(150, 300), turn_words=20, reply_tokens=4, swipes=2, pause_s=0)
    with Scripted() as server:
        measures = run_session(server.url, plan, server="scripted", model="m")
    requests = [r["messages"] for r in server.requests]
    steps = [m.step for m in measures]
    assert len(requests) == len(measures)
    assert steps.count(Step.EDIT_BACK) == steps.count(Step.RETURN) == 2  # one per length
    for i, step in enumerate(steps):
        if step == Step.SWIPE:  # the same messages again, another seed
            assert requests[i] == requests[i - 1]
            assert server.requests[i]["seed"] != server.requests[i - 1]["seed"]
        if step == Step.EDIT_BACK:  # the user message EDIT_BACK turns back, changed
            before = requests[i - 1]  # the last swipe: the history but its last reply
            back = len(before) + 1 - 2 * EDIT_BACK
            assert before[back]["role"] == "user"
            assert requests[i] == [*before[:back], {"role": "user", "content": EDIT_TEXT}]
        if step == Step.RETURN:  # the first branch, with the last swipe kept as the reply
            before = requests[i - 2]
            assert requests[i][:len(before)] == before
            assert requests[i][len(before)]["content"] == f"reply {i - 1} and more"
            assert requests[i][-1]["content"].startswith(RETURN_TEXT)
    reached = [m for m in measures if m.step == Step.RETURN]
    assert [m.length for m in reached] == [150, 300]
    assert all(m.answer.decoded is not None for m in measures)
    assert all(m.answer.text.endswith(" and more") for m in measures)
    with Scripted() as again:  # a server that reports no usage follows the first's turns
        replayed = run_session(again.url, plan, server="other", model="m",
                               at_turns=api_session.reached_at(measures))
    assert [(m.step, m.turn) for m in replayed] == [(m.step, m.turn) for m in measures]


def test_a_server_that_refuses_a_longer_prompt_keeps_the_lengths_it_finished() -> None:
    plan = Plan(lengths=(150, 300), turn_words=20, reply_tokens=4, swipes=1, pause_s=0)
    with Scripted() as server:
        whole = run_session(server.url, plan, server="scripted", model="m")
    with Scripted(limit=200) as server, pytest.raises(api_session.SessionCut) as cut:
        run_session(server.url, plan, server="scripted", model="m")
    assert "before 300 tokens" in str(cut.value) and "exceeds the context" in str(cut.value)
    assert [(m.step, m.length) for m in cut.value.measures] == \
        [(m.step, m.length) for m in whole if m.length == 150]
    with Scripted() as again:  # a server after a cut one: the lengths the cut one reached
        followed = run_session(again.url, plan, server="other", model="m",
                               at_turns=api_session.reached_at(cut.value.measures))
    assert [(m.step, m.turn) for m in followed] == \
        [(m.step, m.turn) for m in cut.value.measures]


def test_each_request_but_the_first_waits_the_pause() -> None:
    plan = Plan(lengths=(40,), turn_words=20, reply_tokens=4, swipes=1, pause_s=0.05)
    sleeps: list[float] = []
    with Scripted() as server, pytest.MonkeyPatch.context() as patch:
        patch.setattr(api_session.time, "sleep", sleeps.append)
        measures = run_session(server.url, plan, server="scripted", model="m")
    assert sleeps == [0.05] * (len(measures) - 1) and len(measures) > 2


def test_what_a_server_reused_is_read_from_usage_or_from_timings() -> None:
    messages = [{"role": "user", "content": "one two three four"}]
    for timings in (False, True):
        with Scripted(timings=timings) as server:
            first = ask(server.url, messages, model="x", max_tokens=4, seed=1)
            again = ask(server.url, messages, model="x", max_tokens=4, seed=2)
        assert (first.prompt_tokens, first.cached_tokens, first.decoded) == (4, 0, 4)
        assert (again.cached_tokens, again.decoded) == (4, 0)
        assert again.completion_tokens == 3 and again.text == "reply 2 and more"


def test_a_chat_on_a_server_continues_a_reply_as_an_assistant_prefill() -> None:
    with Scripted() as server:
        chat = ServerChat(server.url)
        text, _, decoded = chat.resume([{"role": "user", "content": "tell me"}], "Once", 8)
    sent = server.requests[-1]
    assert sent["messages"][-1] == {"role": "assistant", "content": "Once"}
    assert sent["temperature"] == 0.0 and sent["max_tokens"] == 8 and chat.model == \
        "scripted-model"
    assert text == "reply 1 and more" and decoded == 3


def answer(ttft: float, prompt: int | None = 100, cached: int | None = 90) -> Answer:
    return Answer("t", ttft, prompt, cached, 8, 20.0)


def test_medians_take_the_recent_turns_and_say_when_a_server_does_not_report() -> None:
    measures = [Measure("a", "m", Step.TURN, 500, turn, answer(1000.0 * (turn + 1)))
                for turn in range(6)]
    measures += [Measure("a", "m", Step.EDIT_BACK, 500, 6, answer(50.0)),
                 Measure("b", "m", Step.TURN, 500, 0, answer(70.0, cached=None))]
    rows = {row.server: row for row in summarise(measures)}
    assert rows["a"].ttft_ms[Step.TURN] == 5000.0  # turns 3, 4, 5: the last three
    assert rows["a"].ttft_ms[Step.EDIT_BACK] == 50.0 and rows["a"].ttft_ms[Step.RETURN] is None
    assert rows["a"].decoded[Step.TURN] == 10.0 and rows["a"].decoded_total == 70
    assert rows["b"].decoded[Step.TURN] is None and rows["b"].decoded_total is None


def test_the_table_comes_from_the_json_and_names_absent_servers() -> None:
    measures = [Measure(Server.ARBOR.value, "m", Step.TURN, 500, 0, answer(120.0))]
    data = json.loads(json.dumps(to_json(measures, {"llama-server": "no cmake"},
                                         Plan((500,)))))
    assert from_json(data) == measures
    table = markdown(data)
    assert f"| m | 500 | {Server.ARBOR.label} | 0.12 (10) |" in table
    assert "llama-server: not run: no cmake" in table


# --- the real servers, on a tiny model ---------------------------------------------------


def test_arbor_and_llama_cpp_python_serve_the_whole_session(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARBOR_HOME", str(tmp_path / "home"))
    plan = Plan(lengths=(160,), turn_words=20, reply_tokens=4, swipes=1, pause_s=0.2)
    measures, absent = api_session.measure(
        [("tiny", tiny_models["dense"])], [Server.ARBOR, Server.LLAMA_CPP_PYTHON], plan,
        n_threads=2, n_batch=64, work=tmp_path)
    assert absent == {}
    for server in (Server.ARBOR, Server.LLAMA_CPP_PYTHON):
        mine = [m for m in measures if m.server == server.value]
        assert {m.step for m in mine} == set(Step), server
    arbor = [m for m in measures if m.server == Server.ARBOR.value]
    swipes = [m for m in arbor if m.step == Step.SWIPE]
    assert swipes and all(m.answer.cached_tokens for m in swipes)  # Arbor reports reuse
    returned = next(m for m in arbor if m.step == Step.RETURN)
    assert returned.answer.decoded is not None and returned.answer.prompt_tokens is not None
    assert returned.answer.decoded < returned.answer.prompt_tokens / 2
