"""The local OpenAI-compatible server, driven by the official `openai` client against a real
engine (in its own process) on the tiny fixture models of every memory kind."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI

from engine.api.engines import OwnEngine
from engine.api.guard import ConnectionLimits
from engine.api.server import Server, ServerOptions, api_key_of, check_binding, model_id_of
from engine.api.trees import LocalTrees
from engine.api.worker import ApiWorker
from engine.config.settings import Settings
from engine.core.tree import NodeStatus, Role
from engine.storage.store import Store
from tests.engine.llm.test_samplers import SCHEMA

# `serving` runs the API on its own engine process.
pytestmark = pytest.mark.engine_process

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT = 240.0  # a hang guard, not a speed claim
SETTINGS = Settings(n_ctx=1024, max_tokens=12)
SYSTEM = "You are a patient guide to rivers. " * 6
FIRST = "Tell me how a river delta forms, and why the silt settles where it does. " * 3


@contextmanager
def serving(model: Path, db: Path, *, settings: Settings = SETTINGS, api_key: str | None = None,
            max_queue: int = 16, cors_origins: tuple[str, ...] = (),
            limits: ConnectionLimits | None = None) -> Iterator[tuple[Server, OpenAI]]:
    engine = OwnEngine(model, settings)
    worker = ApiWorker(lambda: LocalTrees(db), engine, max_queue=max_queue)
    worker.start()
    server = Server(worker, lambda: model_id_of(model),
                    ServerOptions(port=0, api_key=api_key, cors_origins=cors_origins,
                                  limits=limits or ConnectionLimits()))
    server.start()
    client = OpenAI(base_url=server.url, api_key=api_key or "unused", max_retries=0,
                    timeout=TIMEOUT)
    try:
        yield server, client
    finally:
        client.close()
        server.stop()
        worker.close()
        engine.close()


def ask(client: OpenAI, messages: list[dict[str, str]], **extra: Any) -> Any:
    extra.setdefault("max_tokens", 12)
    extra.setdefault("temperature", 0.0)
    return client.chat.completions.create(
        model="", messages=messages, **extra)  # type: ignore[arg-type]


def chat(*turns: str) -> list[dict[str, str]]:
    """system, then user/assistant alternating."""
    out = [{"role": "system", "content": SYSTEM}]
    for index, text in enumerate(turns):
        out.append({"role": "user" if index % 2 == 0 else "assistant", "content": text})
    return out


def tail(response: Any) -> int:
    usage = response.usage
    return int(usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens)


@pytest.mark.parametrize("kind", ["dense", "sliding_window", "recurrent", "hybrid"])
def test_regenerate_edit_and_switch_back_decode_only_the_tail_and_match_a_fresh_server(
    kind: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    model = tiny_models[kind]
    with serving(model, tmp_path / "a.db") as (_server, client):
        one = ask(client, chat(FIRST))
        assert one.usage.prompt_tokens > 100 and tail(one) == one.usage.prompt_tokens
        reply1 = one.choices[0].message.content
        two = ask(client, chat(FIRST, reply1, "And where does the sea come in?"))
        reply2 = two.choices[0].message.content
        three = ask(client, chat(FIRST, reply1, "And where does the sea come in?", reply2,
                                 "What about tides?"))
        # A swipe: the same request again; a new reply from the state before it, sampled
        # from the logits its prompt-end checkpoint kept: nothing decoded. (Greedy: the
        # same words as the reply it swipes, which the fresh server below checks.)
        again = ask(client, chat(FIRST, reply1, "And where does the sea come in?", reply2,
                                 "What about tides?"))
        assert tail(again) == 0, again.usage
        assert again.choices[0].message.content == three.choices[0].message.content
        # An edit of an earlier message: everything before it is reused.
        edited = ask(client, chat(FIRST, reply1, "And what do floods do to it?"))
        assert tail(edited) < 40 and edited.usage.prompt_tokens_details.cached_tokens > 100
        # Back to the first branch.
        back = ask(client, chat(FIRST, reply1, "And where does the sea come in?", reply2,
                                "What about tides?", again.choices[0].message.content,
                                "Thank you."))
        assert tail(back) < 40, back.usage
    # A freshly started server on the same trees (the nodes keep their tokens), with nothing
    # cached and no disk tier, gives the same words for every step: a full reprocess.
    shutil.copy(tmp_path / "a.db", tmp_path / "b.db")
    fresh_settings = Settings(n_ctx=1024, max_tokens=12, disk_tier=False)
    with serving(model, tmp_path / "b.db", settings=fresh_settings) as (_server, client):
        for response, messages in [
            (three, chat(FIRST, reply1, "And where does the sea come in?", reply2,
                         "What about tides?")),
            (edited, chat(FIRST, reply1, "And what do floods do to it?")),
            (back, chat(FIRST, reply1, "And where does the sea come in?", reply2,
                        "What about tides?", again.choices[0].message.content, "Thank you.")),
        ]:
            cold = ask(client, messages)
            assert cold.choices[0].message.content == response.choices[0].message.content
            assert cold.usage.prompt_tokens == response.usage.prompt_tokens


NOTE = ("The vault code is 4417. Remember it for me, along with the shelf where the spare "
        "key sits: third from the top, behind the atlas. ") * 2


@pytest.mark.parametrize("kind", ["dense", "recurrent"])
def test_cached_tokens_tell_a_client_nothing_of_another_clients_messages(
    kind: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 24's cache oracle: right after client a's private note, a guesser's right guess
    reused all but a few of its tokens (a's live cache, a's checkpoint at the note's end),
    a wrong one only the system prompt. Now each `user` is a cache scope of its own: both
    guesses reuse nothing, the same words come back, and a's own swipe still reuses a's."""
    db = tmp_path / "a.db"
    wrong = NOTE.replace("4417", "9032")

    def note(text: str, user: str | None) -> Any:
        return ask(client, chat(text), **({"user": user} if user is not None else {}))

    with serving(tiny_models[kind], db) as (_server, client):
        private = note(NOTE, "a")
        swipe = note(NOTE, "a")
        assert tail(swipe) == 0, swipe.usage  # a's own state serves a, with its logits
        right = note(NOTE, "b")
        note(NOTE, "a")  # a's again: its branch is what the engine holds and warms
        guessed = note(wrong, "c")
        cached = [r.usage.prompt_tokens_details.cached_tokens for r in (right, guessed)]
        assert cached == [0, 0], cached  # before: all but the tail, and the system prompt
        assert right.choices[0].message.content == private.choices[0].message.content
        # No `user` is one more scope, with nothing of the others'.
        anonymous = note(NOTE, None)
        assert anonymous.usage.prompt_tokens_details.cached_tokens == 0
    with Store(db) as store:  # and no tree is shared: a's, b's, the anonymous one, c's
        titles = sorted(info.title for info in store.list())
        assert titles == sorted(["API: " + " ".join(text.split())[:60]
                                 for text in (NOTE, NOTE, NOTE, wrong)])


def test_streaming_gives_the_same_text_in_chunks_and_usage_when_asked(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    with serving(tiny_models["dense"], tmp_path / "a.db") as (_server, client):
        whole = ask(client, chat("Hello there"))
        chunks = list(ask(client, chat("Hello there"), stream=True,
                          stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content and text
        assert chunks[0].choices[0].delta.role == "assistant"
        finals = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finals[-1] in ("stop", "length") and finals[:-1] == [None] * (len(finals) - 1)
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        # The swipe was served from the cache: all but the generation prompt's tail.
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
        plain = list(ask(client, chat("Hello there"), stream=True))
        assert all(c.usage is None for c in plain)


def test_api_conversations_are_trees_in_the_store(tiny_models: dict[str, Path],
                                                  tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with serving(tiny_models["dense"], db) as (_server, client):
        one = ask(client, chat("Hi"))
        ask(client, chat("Hi"))  # a swipe
        ask(client, chat("Hi", one.choices[0].message.content, "More"))
        ask(client, chat("Something else"))
    with Store(db) as store:
        infos = store.list()
        assert sorted(i.title for i in infos) == ["API: Hi", "API: Something else"]
        tree = store.load(next(i.id for i in infos if i.title == "API: Hi"))
        user = tree.node(tree.root.children[0])
        assert tree.root.text == SYSTEM and user.text == "Hi" and len(tree.root.children) == 1
        assert len(user.children) == 2  # the first reply and the swipe
        assert [n.role for n in tree.messages()] == [Role.USER, Role.ASSISTANT, Role.USER,
                                                     Role.ASSISTANT]


def test_a_stop_sequence_cuts_the_reply_and_the_node_keeps_what_the_client_got(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    db = tmp_path / "a.db"
    with serving(tiny_models["dense"], db) as (_server, client):
        free = ask(client, chat("Count"), max_tokens=24)
        text = free.choices[0].message.content
        assert len(text) > 4
        stop = text[3:5]
        cut = ask(client, chat("Count"), max_tokens=24, stop=[stop])
        expected = text[: text.index(stop)]
        assert cut.choices[0].message.content == expected
        assert cut.choices[0].finish_reason == "stop"
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           ask(client, chat("Count"), max_tokens=24, stop=stop, stream=True))
        assert streamed == expected
    with Store(db) as store:
        tree = store.load(store.list()[0].id)
        replies = [tree.node(c) for c in tree.node(tree.root.children[0]).children]
        assert sorted(r.text for r in replies) == sorted([text, expected, expected])


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    db = tmp_path / "a.db"
    with serving(tiny_models["dense"], db) as (server, client):
        url = server.url + "/chat/completions"
        good = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

        def post(body: bytes | dict[str, Any]) -> httpx.Response:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return httpx.post(url, content=content, timeout=TIMEOUT,
                              headers={"content-type": "application/json"})

        cases: list[tuple[bytes | dict[str, Any], int, str]] = [
            (b"{not json", 400, "not valid JSON"),
            (b"[1, 2]", 400, "JSON object"),
            ({**good, "messages": []}, 400, "non-empty"),
            ({**good, "messages": "hi"}, 400, "non-empty"),
            ({**good, "messages": [{"role": "tool", "content": "x"}]}, 400, "tool_call_id"),
            ({**good, "messages": [{"role": "robot", "content": "x"}]}, 400, "'robot'"),
            ({**good, "messages": [{"role": "user", "content": 5}]}, 400, "content"),
            ({**good, "messages": [{"role": "assistant", "content": "x"}]}, 400,
             "must follow a user message"),
            ({**good, "max_tokens": "many"}, 400, "integer"),
            ({**good, "temperature": 9}, 400, "between"),
            ({**good, "n": 2}, 400, "'n' must be 1"),
            ({**good, "user": 7}, 400, "'user' must be a string"),
            ({**good, "user": "u" * 5000}, 400, "'user' must be a string"),
            ({**good, "model": "gpt-4o"}, 404, "not loaded"),
            (json.dumps({**good, "pad": "x" * (5 << 20)}).encode(), 413, "bytes"),
            ({**good, "messages": [{"role": "user", "content": "river " * 3000}]}, 400,
             "context holds 1024"),
        ]
        for body, status, words in cases:
            answer = post(body)
            assert answer.status_code == status, (answer.status_code, answer.text[:200])
            error = answer.json()["error"]
            assert words in error["message"] and error["type"]
        assert httpx.get(server.url + "/nothing", timeout=TIMEOUT).status_code == 404
        with pytest.raises(openai.BadRequestError, match="context holds 1024"):
            ask(client, [{"role": "user", "content": "river " * 3000}], stream=True)
        assert ask(client, chat("Still there?")).choices[0].message.content is not None
    with Store(db) as store:  # the refused requests left no trace
        assert [i.title for i in store.list()] == ["API: Still there?"]


def test_a_web_page_cannot_drive_the_api_by_rebinding_its_name_or_posting_plain_text(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Each of these answered 200 and ran the model into the user's conversations: a page
    whose name was rebound to 127.0.0.1 (its Host), a cross-site fetch with a text/plain or
    form body (no CORS preflight), any page's Origin."""
    db = tmp_path / "a.db"
    with serving(tiny_models["dense"], db, cors_origins=("http://allowed.example",)) as (
            server, client):
        root = f"http://127.0.0.1:{server.port}"
        body = json.dumps({"messages": [{"role": "user", "content": "planted"}],
                           "max_tokens": 4}).encode()
        json_type = {"content-type": "application/json"}
        refused = [
            ("GET", "/v1/models", {"host": f"attacker.example:{server.port}"}, 403, "loopback"),
            ("GET", "/arbor/stats", {"host": "attacker.example"}, 403, "loopback"),
            ("POST", "/v1/chat/completions", {**json_type, "host": "attacker.example"}, 403,
             "loopback"),
            ("POST", "/v1/chat/completions", {"host": "[::1]", **json_type}, 403, "loopback"),
            ("POST", "/v1/chat/completions", {"content-type": "text/plain"}, 415, "JSON"),
            ("POST", "/v1/chat/completions",
             {"content-type": "application/x-www-form-urlencoded"}, 415, "JSON"),
            ("POST", "/v1/chat/completions", {}, 415, "JSON"),
            ("POST", "/v1/chat/completions", {**json_type, "origin": "https://evil.example"},
             403, "evil.example"),
            ("GET", "/v1/models", {"origin": "null"}, 403, "null"),
        ]
        for method, path, headers, status, words in refused:
            answer = httpx.request(method, root + path, headers=headers, timeout=TIMEOUT,
                                   content=body if method == "POST" else None)
            assert answer.status_code == status, (path, headers, answer.text[:200])
            assert words in answer.json()["error"]["message"]
        for headers in ({"host": f"localhost:{server.port}"},
                        {"host": f"127.0.0.1:{server.port}"},
                        {"origin": "http://allowed.example"}):
            answer = httpx.get(root + "/v1/models", headers=headers, timeout=TIMEOUT)
            assert answer.status_code == 200, (headers, answer.text[:200])
        answer = httpx.post(root + "/v1/chat/completions", content=body, timeout=TIMEOUT,
                            headers={"content-type": "application/json; charset=utf-8"})
        assert answer.status_code == 200 and ask(client, chat("Still there?")).choices
    with Store(db) as store:  # the refused requests left no trace
        assert sorted(i.title for i in store.list()) == ["API: Still there?", "API: planted"]


def test_a_key_is_required_when_set_and_other_addresses_need_the_flag(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    with serving(tiny_models["dense"], tmp_path / "a.db", api_key="s3cret") as (server, client):
        assert ask(client, chat("hi")).choices
        other = OpenAI(base_url=server.url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            ask(other, chat("hi"))
        other.close()
        no_key = httpx.get(server.url + "/models", timeout=TIMEOUT)
        assert no_key.status_code == 401 and "API key" in no_key.json()["error"]["message"]
        assert [m.id for m in client.models.list()] == [model_id_of(tiny_models["dense"])]
    with pytest.raises(ValueError, match="--allow-remote and --api-key"):
        check_binding(ServerOptions(host="0.0.0.0"))
    with pytest.raises(ValueError):
        check_binding(ServerOptions(host="0.0.0.0", allow_remote=True))
    check_binding(ServerOptions(host="0.0.0.0", allow_remote=True, api_key="k"))


def test_a_client_that_leaves_mid_stream_stops_its_reply_and_frees_the_engine(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    db = tmp_path / "a.db"
    with serving(tiny_models["dense"], db, max_queue=1) as (server, client):
        url = server.url + "/chat/completions"
        body = {"messages": [{"role": "user", "content": "Go on forever"}],
                "max_tokens": 1000, "stream": True}
        with httpx.stream("POST", url, json=body, timeout=TIMEOUT) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            # While it streams, one request may wait; the next is turned away.
            waiting = threading.Thread(target=ask, args=(client, chat("queued")))
            waiting.start()
            worker = server.worker
            while worker._queue.qsize() == 0:  # the queue is what this tests
                threading.Event().wait(0.01)
            with pytest.raises(openai.RateLimitError):
                ask(client, chat("one too many"))
        waiting.join()  # served once the first client left
        assert ask(client, chat("after")).choices
    with Store(db) as store:
        info = next(i for i in store.list() if i.title == "API: Go on forever")
        reply = store.load(info.id).messages()[-1]
        assert reply.role is Role.ASSISTANT and reply.status is NodeStatus.INTERRUPTED
        assert reply.text


def test_the_api_key_comes_from_a_private_file_or_the_environment(tmp_path: Path) -> None:
    """It could only be given on the command line, which every local user can read."""
    private = tmp_path / "key"
    private.write_text("s3cret-ü\n", encoding="utf-8")
    private.chmod(0o600)
    assert api_key_of(None, private, {}) == "s3cret-ü"
    assert api_key_of(None, None, {"ARBOR_API_KEY": "from-env"}) == "from-env"
    assert api_key_of("flag", None, {"ARBOR_API_KEY": "from-env"}) == "flag"
    assert api_key_of(None, None, {}) is None
    private.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        api_key_of(None, private, {})
    with pytest.raises(ValueError, match="cannot read"):
        api_key_of(None, tmp_path / "missing", {})
    done = subprocess.run(
        [sys.executable, "-m", "engine", "serve", "--api-key-file", str(private)],
        cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "chmod 600" in done.stderr


def test_a_key_with_non_ascii_characters_works_when_it_is_right(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """The header was compared after a Latin-1 decode and a UTF-8 encode: refused when right."""
    key = "clé-ü-\u6f22"
    with serving(tiny_models["dense"], tmp_path / "a.db", api_key=key) as (server, _client):
        def models(value: bytes) -> int:
            return httpx.get(server.url + "/models", headers={"authorization": value},
                             timeout=TIMEOUT).status_code

        assert models(b"Bearer " + key.encode("utf-8")) == 200
        assert models(b"Bearer " + key.encode("latin-1", "replace")) == 401


RIVER = SCHEMA  # the engine's JSON-output tests' schema, through the API


def test_samplers_and_json_output_are_applied_and_the_others_refused_by_name(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """What SillyTavern, Open WebUI and agent frameworks send: a logit bias that forces a
    token changes the reply (so the samplers reach the engine), JSON output parses and
    validates, streamed too; a sampler Arbor lacks, a broken schema and a token the model
    does not have are 400s that leave no trace."""
    db = tmp_path / "a.db"
    settings = Settings(n_ctx=1024, max_tokens=120)
    question = [{"role": "user", "content": "Name the longest river, and say if it is long."}]
    with serving(smollm2_path, db, settings=settings) as (server, client):
        plain = ask(client, question, max_tokens=12).choices[0].message.content
        forced = ask(client, question, max_tokens=12, user="forced",
                     extra_body={"logit_bias": {"300": 100}, "top_k": 5, "min_p": 0.1,
                                 "repetition_penalty": 1.1, "frequency_penalty": 0.5,
                                 "presence_penalty": 0.5}).choices[0].message.content
        piece = forced[: len(forced) // 12]
        assert piece and forced == piece * 12 and forced != plain
        typed = ask(client, question, max_tokens=120, temperature=1.0, seed=4,
                    response_format={"type": "json_schema",
                                     "json_schema": {"name": "river", "schema": RIVER}})
        assert typed.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(typed.choices[0].message.content), RIVER)
        in_json = [{"role": "system", "content": "You answer in JSON."}, *question]
        streamed = ask(client, in_json, max_tokens=300, stream=True,
                       response_format={"type": "json_object"})
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert isinstance(json.loads(text), dict)

        url = server.url + "/chat/completions"
        for extra, words in [({"typical_p": 0.5}, "'typical_p' is a sampler"),
                             ({"mirostat": 2}, "'mirostat' is a sampler"),
                             ({"response_format": {"type": "xml"}}, "json_schema"),
                             ({"response_format": {"type": "json_schema", "json_schema": {
                                 "name": "x", "schema": {"type": "nope"}}}},
                              "invalid JSON schema"),
                             ({"logit_bias": {"river": 1}}, "token ids"),
                             ({"logit_bias": {"999999": 1}}, "not in this model's vocabulary"),
                             ({"repetition_penalty": 0}, "above 0")]:
            answer = httpx.post(url, json={"messages": question, "max_tokens": 4,
                                           "user": "refused", **extra}, timeout=TIMEOUT)
            assert answer.status_code == 400, (extra, answer.text[:200])
            assert words in answer.json()["error"]["message"]
    with Store(db) as store:  # one per user and system prompt; the refused left none
        titles = [i.title for i in store.list()]
        assert len(titles) == 3 and all(t.startswith("API: Name the longest") for t in titles)


@pytest.mark.parametrize("kind", ["dense", "recurrent"])
def test_an_assistant_message_last_is_continued_as_a_fresh_server_continues_it(
    kind: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """SillyTavern's "continue": the request ends with the assistant's unfinished reply.
    The answer is only the new text, the same as a server that never saw the conversation
    gives, streamed or not; the tree keeps the continued reply as a reply of its own beside
    the one it began as, and a next turn that quotes it whole finds it. One that fails says
    nothing and leaves no trace."""
    with serving(tiny_models[kind], tmp_path / "a.db") as (_server, client):
        first = ask(client, chat(FIRST), max_tokens=16).choices[0].message.content
        begun = first[: len(first) // 2]
        ask_on = chat(FIRST, begun)
        went_on = ask(client, ask_on, max_tokens=8)
        assert went_on.usage.prompt_tokens_details.cached_tokens > 0  # the prompt was kept
        more = went_on.choices[0].message.content
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           ask(client, ask_on, max_tokens=8, stream=True))
        assert streamed == more and more
        with pytest.raises(openai.BadRequestError, match="vocabulary"):
            ask(client, ask_on, extra_body={"logit_bias": {"99999999": 1}})
        assert ask(client, chat(FIRST, begun + more, "Go on.")).choices[0].message.content
    with serving(tiny_models[kind], tmp_path / "fresh.db") as (_server, fresh):
        assert ask(fresh, ask_on, max_tokens=8).choices[0].message.content == more
    with Store(tmp_path / "a.db") as store:
        (info,) = store.list()
        tree = store.load(info.id)
        user = tree.node(tree.root.children[0])
        replies = sorted(tree.node(c).text for c in user.children)
        assert replies == sorted([first, begun + more, begun + more])  # none for the failure
        assert [n.text for n in tree.messages()][-3:-1] == [begun + more, "Go on."]


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Today's weather in a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                   "required": ["city"], "additionalProperties": False}}}


def test_a_tool_loop_through_the_openai_client_is_a_branch_in_the_tree(
    tool_models: dict[str, Path], tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """A forced call comes back as OpenAI's tool_calls (streamed too, never as text); the
    client sends it back with the result and gets the answer, the call's tokens reused; the
    tree holds user, call, result, answer. A model whose template takes no tools, and a
    choice of a tool not offered, are 400s."""
    db = tmp_path / "a.db"
    asked = [{"role": "user", "content": "Is it raining in Oslo?"}]
    with serving(tool_models["dense"], db) as (_server, client):
        first = ask(client, asked, max_tokens=60, tools=[WEATHER_TOOL],
                    tool_choice="required")
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")

        named = {"type": "function", "function": {"name": "get_weather"}}
        whole = ask(client, asked, max_tokens=60, tools=[WEATHER_TOOL], tool_choice=named)
        with client.chat.completions.stream(
                model="", messages=asked, max_tokens=60, temperature=0.0, tools=[WEATHER_TOOL],
                tool_choice=named) as stream:  # type: ignore[arg-type]
            chunks = [event.chunk for event in stream if event.type == "chunk"]
            streamed = stream.get_final_completion().choices[0]
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
        assert deltas[0].id and deltas[0].function.name == "get_weather"
        assert deltas[0].function.arguments == "" and len(deltas) >= 2
        assert not streamed.message.content and streamed.finish_reason == "tool_calls"
        assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] \
            == [(c.function.name, c.function.arguments)
                for c in whole.choices[0].message.tool_calls]
        # Cut by max_tokens inside the arguments: not a call. What was streamed of it stays
        # (docs/api.md), its text comes as content, and the finish is "length".
        cut = ask(client, asked, max_tokens=18, tools=[WEATHER_TOOL], tool_choice=named)
        assert cut.choices[0].finish_reason == "length"
        assert not cut.choices[0].message.tool_calls
        assert cut.choices[0].message.content.startswith("<tool_call>")
        with client.chat.completions.stream(
                model="", messages=asked, max_tokens=18, temperature=0.0, tools=[WEATHER_TOOL],
                tool_choice=named) as stream:  # type: ignore[arg-type]
            stream.until_done()  # get_final_completion refuses a "length" finish
            partial = stream.current_completion_snapshot.choices[0]
        assert partial.finish_reason == "length"
        assert partial.message.content == cut.choices[0].message.content
        (begun,) = partial.message.tool_calls
        assert begun.function.name == "get_weather"
        assert call.function.arguments.startswith(begun.function.arguments)

        loop = [*asked, {"role": "assistant", "content": None,
                         "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": '{"rain": true}'}]
        answer = ask(client, loop, max_tokens=8, tools=[WEATHER_TOOL])
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert answer.usage.prompt_tokens_details.cached_tokens > 0  # the call was kept
        # The same request again (a retry): its whole prompt is reused.
        again = ask(client, loop, max_tokens=8, tools=[WEATHER_TOOL])
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens
        # A second call after the first result, its result, and the answer to both.
        second = ask(client, loop, max_tokens=60, tools=[WEATHER_TOOL],
                     tool_choice="required").choices[0].message.tool_calls[0]
        loop2 = [*loop, {"role": "assistant", "content": None,
                         "tool_calls": [second.model_dump()]},
                 {"role": "tool", "tool_call_id": second.id, "content": '{"rain": false}'}]
        final = ask(client, loop2, max_tokens=8, tools=[WEATHER_TOOL])
        assert final.choices[0].finish_reason in ("stop", "length")
        assert final.usage.prompt_tokens_details.cached_tokens > \
            answer.usage.prompt_tokens_details.cached_tokens
        with pytest.raises(openai.BadRequestError, match="must be none"):
            ask(client, asked, tools=[WEATHER_TOOL],
                tool_choice={"type": "function", "function": {"name": "launch"}})
    with Store(db) as store:
        (info,) = store.list()
        tree = store.load(info.id)
        assert tree.root.meta["tools"][0]["function"]["name"] == "get_weather"
        path = tree.messages()
        assert [n.role for n in path] == [Role.USER, *[Role.ASSISTANT, Role.TOOL] * 2,
                                          Role.ASSISTANT]
        assert path[1].meta["tool_calls"][0]["id"] == call.id
        assert path[2].meta["tool_call_id"] == call.id
        assert path[4].meta["tool_call_id"] == second.id
        assert len(tree.siblings(path[3].id)) == 3  # the answer, its retry, the second call
    with serving(tiny_models["dense"], tmp_path / "b.db") as (_server, plain), \
            pytest.raises(openai.BadRequestError, match="takes no tools"):
        ask(plain, asked, tools=[WEATHER_TOOL])


def test_logprobs_come_for_every_token_streamed_or_not(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    with serving(tiny_models["dense"], tmp_path / "a.db") as (server, client):
        whole = ask(client, chat("Count"), max_tokens=8, logprobs=True, top_logprobs=3)
        content = whole.choices[0].logprobs.content
        assert len(content) == whole.usage.completion_tokens == 8
        assert "".join(t.token for t in content) == whole.choices[0].message.content
        assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
        assert content[0].logprob == content[0].top_logprobs[0].logprob  # greedy: the best
        chunks = list(ask(client, chat("Count"), max_tokens=8, logprobs=True, top_logprobs=3,
                          stream=True))
        streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                    for t in c.choices[0].logprobs.content]
        assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob)
                                                            for t in content]
        assert ask(client, chat("Count")).choices[0].logprobs is None
        url = server.url + "/chat/completions"
        for extra, words in [({"top_logprobs": 2}, "needs 'logprobs'"),
                             ({"logprobs": True, "top_logprobs": 50}, "between 0 and 20"),
                             ({"logprobs": "yes"}, "true or false")]:
            answer = httpx.post(url, json={"messages": chat("Count"), **extra},
                                timeout=TIMEOUT)
            assert answer.status_code == 400 and words in answer.json()["error"]["message"]


def _file_part(name: str, data: bytes, kind: str = "application/pdf") -> dict[str, Any]:
    import base64

    return {"type": "file", "file": {
        "filename": name, "file_data": f"data:{kind};base64,{base64.b64encode(data).decode()}"}}


def test_a_file_part_is_a_document_decoded_once_for_every_question_after_it(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """OpenAI's `file` parts: a PDF's text in the user's node, and a second question on the
    same file (the recurrent model, which cannot cut its state back) restores the state at
    the document's end. Bad files are 400s, and the server goes on serving."""
    from tests.engine.files.test_documents import _pdf

    pdf = _pdf(*(f"Page {n} speaks of rivers and deltas and the silt they carry." * 4
                 for n in range(6)))
    doc = _file_part("rivers.pdf", pdf)

    def asking(question: str) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [doc, {"type": "text", "text": question}]}]

    db = tmp_path / "a.db"
    with serving(tiny_models["recurrent"], db) as (_server, client):
        one = ask(client, asking("What is this about?"))
        assert one.usage.prompt_tokens > 300
        two = ask(client, asking("How many pages?"))
        assert two.usage.prompt_tokens_details.cached_tokens > 300, two.usage
        assert tail(two) < 30, two.usage
        for part, says in [
            (_file_part("x.pdf", b"%PDF-1.4 garbage"), "x.pdf"),
            ({"type": "file", "file": {"file_id": "file-123"}}, "keeps no uploaded files"),
            ({"type": "file", "file": {"filename": "a.txt",
                                       "file_data": "https://example.com/a.txt"}},
             "fetches no remote file"),
            ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
             "images are not supported"),
        ]:
            with pytest.raises(openai.BadRequestError, match=says):
                ask(client, [{"role": "user", "content": [part]}])
        assert ask(client, asking("How many pages?")).choices[0].message.content
    with Store(db) as store:
        infos = store.list()
        users = [n for info in infos for n in store.load(info.id).nodes()
                 if n.role is Role.USER and "documents" in n.meta]
        assert len(users) == 2
        assert {n.meta["documents"][0]["name"] for n in users} == {"rivers.pdf"}
        assert "Page 0 speaks of rivers" in users[0].meta["documents"][0]["text"]
