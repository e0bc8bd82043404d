"""`arbor-engine serve` as a user runs it: in a terminal, ended with Ctrl+C, killed mid-reply,
on a database that will not take a write. Each runs the real command (or the real server) on
the bundled model; waits are on what the program says and does, never on the clock."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.core.tree import NodeStatus
from engine.storage.store import Store

# `arbor serve` in a child process, and its engine process under it (no fixture says so).
pytestmark = pytest.mark.engine_process

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT = 240.0  # a hang guard, not a speed claim
LONG = "Write a long story about a lighthouse keeper and the sea, with many chapters."


class Serve:
    """One `python -m engine serve` in a session of its own (Ctrl+C in a terminal reaches
    the whole process group: so does `interrupt`)."""

    def __init__(self, db: Path, model: Path, env: dict[str, str],
                 launcher: tuple[str, ...] = ("-m", "engine")) -> None:
        self.process = subprocess.Popen(
            [sys.executable, *launcher, "serve", "--port", "0", "--db", str(db),
             "--model", str(model)],
            cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            start_new_session=True)
        try:
            self._wait_for_serving()
            self.engine_pid = _child_of(self.process.pid)
        except BaseException:
            self.close()
            raise

    def _wait_for_serving(self) -> None:
        assert self.process.stderr is not None
        lines: list[str] = []
        for line in self.process.stderr:  # until it says where it serves
            lines.append(line)
            if "serving" in line and " at http" in line:
                self.url = line.rsplit(" at ", 1)[1].strip()
                return
        raise AssertionError("serve ended before serving:\n" + "".join(lines))

    def interrupt(self) -> tuple[int, str]:
        """Ctrl+C: the exit status and everything it wrote after the serving line."""
        os.killpg(self.process.pid, signal.SIGINT)
        assert self.process.stderr is not None
        rest = self.process.stderr.read()
        return self.process.wait(TIMEOUT), rest

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(TIMEOUT)
        if self.process.stderr is not None:
            self.process.stderr.close()


@contextmanager
def serving(tmp_path: Path, model: Path,
            launcher: tuple[str, ...] = ("-m", "engine")) -> Iterator[Serve]:
    env = {**os.environ, "ARBOR_HOME": str(tmp_path / "home")}
    serve = Serve(tmp_path / "api.db", model, env, launcher)
    try:
        yield serve
    finally:
        serve.close()


def _child_of(pid: int) -> int:
    """The engine process: the child of `pid` that multiprocessing spawned (read from
    /proc; the other is multiprocessing's resource tracker)."""
    engines = [int(child) for child in
               Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
               if b"resource_tracker" not in Path(f"/proc/{child}/cmdline").read_bytes()]
    assert len(engines) == 1, engines
    return engines[0]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _body(max_tokens: int = 400, stream: bool = False, text: str = LONG) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": stream}


class Client(threading.Thread):
    """One request on a thread of its own: `first` is set when the first byte of the
    answer has come (a stream's first chunk), `result` is (status, body) at the end."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.first = threading.Event()
        self.result: tuple[int, str] | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/chat/completions", json=self.body,
                              timeout=TIMEOUT) as response:
                parts: list[str] = []
                for part in response.iter_text():
                    self.first.set()
                    parts.append(part)
                self.result = (response.status_code, "".join(parts))
        except httpx.HTTPError as exc:
            self.result = (0, f"{type(exc).__name__}: {exc}")
        finally:
            self.first.set()


def _assert_clean_end(code: int, rest: str, engine_pid: int) -> None:
    assert code == 130, rest
    assert "Traceback" not in rest and "Event loop is closed" not in rest, rest
    assert len(rest.splitlines()) <= 3, rest  # "interrupted", perhaps a warning
    assert not _alive(engine_pid)


def test_ctrl_c_with_requests_queued_answers_them_ends_the_engine_and_exits_130(
        tmp_path: Path, smollm2_path: Path) -> None:
    with serving(tmp_path, smollm2_path) as serve:
        running = Client(serve.url, _body(stream=True))
        running.start()
        assert running.first.wait(TIMEOUT)  # its reply is streaming: the engine is busy
        queued = [Client(serve.url, _body(stream=index % 2 == 0)) for index in range(4)]
        for client in queued:
            client.start()
        # Queued: the server's stats count no finished request, and each waits.
        stats = httpx.get(serve.url.removesuffix("/v1") + "/arbor/stats", timeout=TIMEOUT)
        assert stats.json()["requests"] == 0
        code, rest = serve.interrupt()
        for client in (running, *queued):
            client.join(TIMEOUT)
            assert client.result is not None
        _assert_clean_end(code, rest, serve.engine_pid)
        for client in queued:  # each answered: a 503, or (streams) a status in-band
            status, body = client.result  # type: ignore[misc]
            assert status in (503, 200, 0), client.result
            if status == 200:
                assert "shutting down" in body or "[DONE]" in body, body


def test_ctrl_c_ends_serve_even_when_its_engine_has_stopped_answering(
        tmp_path: Path, smollm2_path: Path) -> None:
    with serving(tmp_path, smollm2_path) as serve:
        os.kill(serve.engine_pid, signal.SIGSTOP)
        waiting = Client(serve.url, _body())
        waiting.start()
        code, rest = serve.interrupt()
        waiting.join(TIMEOUT)
        assert waiting.result is not None
        _assert_clean_end(code, rest, serve.engine_pid)


# `arbor-engine serve` started with SIGINT ignored, as a shell starts a job in the background:
# Python then installs no KeyboardInterrupt handler, and uvicorn's raising of the signal again
# once it has stopped does nothing.
IGNORING_SIGINT = ("-c", "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                         "from engine.cli.main import main; sys.exit(main(sys.argv[1:]))")


def test_sigint_ends_serve_as_interrupted_whatever_handler_it_was_started_with(
        tmp_path: Path, smollm2_path: Path) -> None:
    with serving(tmp_path, smollm2_path, IGNORING_SIGINT) as serve:
        code, rest = serve.interrupt()
        _assert_clean_end(code, rest, serve.engine_pid)
        assert "interrupted" in rest


def test_the_serving_line_comes_once_connections_are_accepted(
        tmp_path: Path, smollm2_path: Path) -> None:
    with serving(tmp_path, smollm2_path) as serve:
        # At once, no retry: the line was the promise that this works.
        models = httpx.get(serve.url + "/models", timeout=TIMEOUT)
        assert models.status_code == 200


def test_serve_killed_mid_reply_leaves_no_streaming_reply_behind(
        tmp_path: Path, smollm2_path: Path) -> None:
    with serving(tmp_path, smollm2_path) as serve:
        first = Client(serve.url, _body(max_tokens=4, text="Name a colour."))
        first.start()
        first.join(TIMEOUT)
        assert first.result is not None and first.result[0] == 200, first.result
        answer = json.loads(first.result[1])["choices"][0]["message"]["content"]
        # The next turn of that conversation (its tree is in the store) is cut by a kill.
        turn = Client(serve.url, {**_body(stream=True), "messages": [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": LONG}]})
        turn.start()
        assert turn.first.wait(TIMEOUT)
        os.killpg(serve.process.pid, signal.SIGKILL)
        serve.process.wait(TIMEOUT)
        turn.join(TIMEOUT)
    with Store(tmp_path / "api.db", recover=False) as store:
        (summary,) = store.list()
        tree = store.load(summary.id)
        nodes = [node for node in tree.nodes() if node.id != tree.root_id]
        assert NodeStatus.STREAMING not in [node.status for node in nodes]
        # The first turn stands; the cut one left nothing.
        assert [node.text for node in nodes] == ["Name a colour.", answer]


def test_a_save_that_fails_keeps_nothing_and_the_next_request_is_answered(
        tmp_path: Path, smollm2_path: Path) -> None:
    with serving(tmp_path, smollm2_path) as serve:
        def turn(*texts: str) -> Client:
            roles = ["user", "assistant"]
            client = Client(serve.url, {**_body(max_tokens=4), "messages": [
                {"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]})
            client.start()
            client.join(TIMEOUT)
            assert client.result is not None
            return client

        first = turn("Name a colour.")
        assert first.result is not None and first.result[0] == 200, first.result
        answer = json.loads(first.result[1])["choices"][0]["message"]["content"]
        # Another program holds the database's write lock past serve's busy timeout.
        blocker = sqlite3.connect(tmp_path / "api.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            failed = turn("Name a colour.", answer, "And another?")
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert failed.result is not None and failed.result[0] == 503, failed.result
        assert "could not be saved" in failed.result[1]
        # The same request again, and one that builds on it: both answered and saved.
        again = turn("Name a colour.", answer, "And another?")
        assert again.result is not None and again.result[0] == 200, again.result
        second = json.loads(again.result[1])["choices"][0]["message"]["content"]
        last = turn("Name a colour.", answer, "And another?", second, "One more?")
        assert last.result is not None and last.result[0] == 200, last.result
    with Store(tmp_path / "api.db", recover=False) as store:
        (summary,) = store.list()
        tree = store.load(summary.id)
        texts = [node.text for node in tree.nodes()]
        assert texts.count("And another?") == 1 and "One more?" in texts

