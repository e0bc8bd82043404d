"""Downloads that never lose a byte, against a local stand-in for the hub
(tests/engine/models/fake_hub.py): resume after a killed process, after dropped connections
and after Cancel; sha256 checked (a corrupted byte refused and removed); 404 and 401; a full
disk; two downloads at once; no network. Every wait is on an event or a file's size."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.files.paths import data_dirs
from engine.models import download_transfer, files
from engine.models.credentials import load_token, save_token
from engine.models.download import Downloader, RetryPolicy
from engine.models.download_parts import (
    DownloadBusyError,
    RemoteFile,
    list_partial,
    part_path,
    sidecar_path,
)
from engine.models.download_transfer import ChecksumMismatchError, DiskFullError, Progress
from engine.models.hub import HubClient
from engine.models.queue import DownloadQueue, JobEvent, JobState
from engine.models.remote import (
    Hub,
    HubAccessError,
    HubCancelledError,
    HubNotFoundError,
    HubOfflineError,
)
from tests.engine.models.fake_hub import TOKEN, FakeHub, FakeHubServer

ROOT = Path(__file__).resolve().parents[3]
REPO = "arbor-test/tiny-GGUF"
NAME = "tiny-dense-F32.gguf"
FAST = RetryPolicy(attempts=3, first_pause=0.0, max_pause=0.0)


@pytest.fixture
def model_bytes(tiny_models: dict[str, Path]) -> bytes:
    return tiny_models["dense"].read_bytes()


@pytest.fixture
def fake_hub(model_bytes: bytes, tiny_models: dict[str, Path]) -> Iterator[FakeHub]:
    half = len(model_bytes) // 2
    with FakeHubServer() as hub:
        hub.add_repo(REPO, {
            NAME: model_bytes,
            "tiny-dense-Q8_0-00001-of-00002.gguf": model_bytes[:half],
            "tiny-dense-Q8_0-00002-of-00002.gguf": model_bytes[half:],
        })
        hub.add_repo("arbor-test/tiny-mamba-GGUF",
                     {"tiny-recurrent-F32.gguf": tiny_models["recurrent"].read_bytes()})
        hub.add_repo("arbor-test/gated-GGUF", {"gated-F32.gguf": model_bytes[:4096]},
                     gated=True)
        yield hub


@pytest.fixture
def models_dir() -> Path:
    return data_dirs().models


def _remote(hub: FakeHub, repo: str = REPO, name: str = NAME, token: str | None = None
            ) -> tuple[Hub, RemoteFile]:
    client = HubClient(Hub(hub.url, token))
    details = client.details(repo)
    found = [f for g in details.groups for f in client.remote_files(details, g)
             if f.path == name]
    return client.hub, found[0]


def test_a_download_lands_verified_and_its_hash_is_cached(
        fake_hub: FakeHub, models_dir: Path, model_bytes: bytes,
        monkeypatch: pytest.MonkeyPatch) -> None:
    hub, remote = _remote(fake_hub)
    seen: list[Progress] = []
    done = Downloader(models_dir, hub).download(remote, progress=seen.append)
    assert done.path == models_dir / NAME and done.path.read_bytes() == model_bytes
    assert done.sha256 == hashlib.sha256(model_bytes).hexdigest() == remote.sha256
    assert (done.resumed_from, done.fetched, done.retries) == (0, len(model_bytes), 0)
    assert seen[-1].done == seen[-1].total == len(model_bytes)
    assert not part_path(done.path).exists() and not sidecar_path(done.path).exists()
    # Loading the model asks for its hash: the cache answers, nothing is hashed again.
    files._hash_cache.clear()
    monkeypatch.setattr(files.hashlib, "sha256", _no_hashing)
    assert files.file_sha256(done.path) == done.sha256
    # Pulling it again finds it there: no request, no part.
    asked = len(fake_hub.cdn_requests())
    again = Downloader(models_dir, hub).download(remote)
    assert (again.path, again.fetched, again.sha256) == (done.path, 0, done.sha256)
    assert len(fake_hub.cdn_requests()) == asked and list_partial(models_dir) == []


def _no_hashing(*args: object) -> object:
    raise AssertionError("hashed again")


def test_a_killed_pull_resumes_from_its_part_with_the_cli(
        fake_hub: FakeHub, models_dir: Path, model_bytes: bytes) -> None:
    """`arbor-engine pull` is killed (SIGKILL) once `hold_at` bytes are on disk; run again,
    it asks for the rest only and verifies the sha256 of the whole."""
    hold_at = len(model_bytes) // 3
    fake_hub.hold_at = hold_at
    env = {**os.environ, "HF_ENDPOINT": fake_hub.url,
           "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
    env.pop("HF_TOKEN", None)
    command = [sys.executable, "-m", "engine", "pull", f"{REPO}:F32"]
    first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    part = part_path(models_dir / NAME)
    fake_hub.held.wait()  # the server sent hold_at bytes and waits
    while not part.exists() or part.stat().st_size < hold_at:  # on the file's size
        assert first.poll() is None, first.communicate()
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    assert first.returncode == -signal.SIGKILL
    fake_hub.hold_at = None
    fake_hub.release.set()

    [partial] = list_partial(models_dir)
    assert (partial.done, partial.remote.size) == (hold_at, len(model_bytes))
    assert partial.remote.sha256 == hashlib.sha256(model_bytes).hexdigest()

    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    target = models_dir / NAME
    assert target.read_bytes() == model_bytes
    assert second.stdout.strip() == str(target)
    fetched = len(model_bytes) - hold_at
    assert f"({fetched} fetched, resumed from {hold_at} bytes" in second.stderr
    assert f"sha256 {partial.remote.sha256} verified" in second.stderr
    assert fake_hub.cdn_requests()[-1].range == f"bytes={hold_at}-"
    assert list_partial(models_dir) == []
    sys.stderr.write(f"\nresumed download: {hold_at} bytes before the kill, {fetched} "
                     f"fetched after, {len(model_bytes)} in all, sha256 "
                     f"{partial.remote.sha256} matches\n")


def test_connections_dropped_every_n_bytes_are_resumed_where_they_stopped(
        fake_hub: FakeHub, models_dir: Path, model_bytes: bytes) -> None:
    every = 1_000_003
    fake_hub.drop_every = every
    hub, remote = _remote(fake_hub)
    done = Downloader(models_dir, hub, retry=FAST).download(remote)
    assert done.path.read_bytes() == model_bytes
    drops = -(-len(model_bytes) // every) - 1
    assert done.retries == drops
    assert [r.range for r in fake_hub.cdn_requests()] == [None] + [
        f"bytes={every * i}-" for i in range(1, drops + 1)]


def test_cancel_keeps_the_part_and_resume_finishes_it(
        fake_hub: FakeHub, models_dir: Path, model_bytes: bytes) -> None:
    hub, remote = _remote(fake_hub)
    cancel = threading.Event()

    def stop_after_two_mib(p: Progress) -> None:
        if p.done >= 2 << 20:
            cancel.set()

    with pytest.raises(HubCancelledError, match="kept to resume"):
        Downloader(models_dir, hub).download(remote, progress=stop_after_two_mib,
                                             cancel=cancel)
    [partial] = list_partial(models_dir)
    assert partial.done >= 2 << 20
    done = Downloader(models_dir, hub).resume(partial)
    assert done.resumed_from == partial.done
    assert done.fetched == len(model_bytes) - partial.done
    assert done.path.read_bytes() == model_bytes


def test_a_tail_lost_in_a_crash_is_fetched_again_not_the_whole_file(
        fake_hub: FakeHub, models_dir: Path, model_bytes: bytes) -> None:
    """A machine that stopped may keep a part's size but not its bytes written after the
    last fsync (the sidecar's `synced`): those are fetched again; the rest is kept."""
    hub, remote = _remote(fake_hub)
    cancel = threading.Event()

    def stop(p: Progress) -> None:
        if p.done >= 2 << 20:
            cancel.set()

    with pytest.raises(HubCancelledError):
        Downloader(models_dir, hub).download(remote, progress=stop, cancel=cancel)
    part = part_path(models_dir / NAME)
    synced = json.loads(sidecar_path(models_dir / NAME).read_text())["synced"]
    assert synced == part.stat().st_size >= 2 << 20
    with part.open("ab") as f:  # the size survived, the data did not: zeros
        f.write(bytes(1 << 20))
    done = Downloader(models_dir, hub).download(remote)
    assert done.path.read_bytes() == model_bytes
    ranges = [r.range for r in fake_hub.cdn_requests()]
    assert ranges[-2:] == [f"bytes={synced + (1 << 20)}-", f"bytes={synced}-"]


def test_a_corrupted_byte_is_refused_and_the_part_removed(
        fake_hub: FakeHub, models_dir: Path) -> None:
    fake_hub.corrupt_at = 123_457
    hub, remote = _remote(fake_hub)
    with pytest.raises(ChecksumMismatchError, match=r"arrived damaged .* was deleted"):
        Downloader(models_dir, hub).download(remote)
    target = models_dir / NAME
    assert not target.exists() and not part_path(target).exists()
    assert not sidecar_path(target).exists()


def test_a_missing_file_is_a_404(fake_hub: FakeHub, models_dir: Path) -> None:
    hub, remote = _remote(fake_hub)
    gone = RemoteFile(REPO, "gone-Q4_0.gguf", hub.resolve_url(REPO, "gone-Q4_0.gguf"), None,
                      None)
    with pytest.raises(HubNotFoundError, match=r"no file gone-Q4_0.gguf in arbor-test"):
        Downloader(models_dir, hub).download(gone)
    assert remote.size is not None


def test_a_gated_repository_needs_the_token_which_is_never_logged(
        fake_hub: FakeHub, models_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    hub, remote = _remote(fake_hub, "arbor-test/gated-GGUF", "gated-F32.gguf")
    with pytest.raises(HubAccessError, match=r"needs an access token: .*gated"):
        Downloader(models_dir, hub).download(remote)
    wrong = Hub(fake_hub.url, "hf_wrong")
    with pytest.raises(HubAccessError, match=r"cannot read .*accept the repository's terms"):
        Downloader(models_dir, wrong).download(remote)
    with_token = Hub(fake_hub.url, TOKEN)
    assert TOKEN not in repr(with_token)
    done = Downloader(models_dir, with_token).download(remote)
    assert done.size == 4096
    assert TOKEN not in caplog.text


def test_the_token_is_kept_in_a_private_file_without_a_keyring(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import keyring
    from keyring.backends import fail

    monkeypatch.delenv("HF_TOKEN", raising=False)
    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        assert load_token() is None
        assert save_token(TOKEN).value == "file"
        path = data_dirs().config / "hf-token"
        assert path.stat().st_mode & 0o777 == 0o600
        assert load_token() == TOKEN
    finally:
        keyring.set_keyring(previous)


def test_a_full_disk_stops_cleanly_with_the_part_kept(
        fake_hub: FakeHub, models_dir: Path, model_bytes: bytes,
        monkeypatch: pytest.MonkeyPatch) -> None:
    hub, remote = _remote(fake_hub)
    # Before starting: too little free space, nothing is asked of the server.
    monkeypatch.setattr(download_transfer, "_free_bytes", lambda folder: 1 << 20)
    with pytest.raises(DiskFullError, match=r"full .* more are needed"):
        Downloader(models_dir, hub).download(remote)
    assert fake_hub.cdn_requests() == []
    monkeypatch.undo()

    # While writing: the write itself fails with ENOSPC after 3 MiB.
    real_write = download_transfer._write_at
    limit = 3 << 20

    def full_disk(fd: int, data: memoryview, offset: int) -> int:
        if offset + len(data) > limit:
            if offset < limit:
                return real_write(fd, data[: limit - offset], offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data, offset)

    monkeypatch.setattr(download_transfer, "_write_at", full_disk)
    with pytest.raises(DiskFullError, match=rf"{limit} bytes of {re.escape(NAME)} are kept"):
        Downloader(models_dir, hub).download(remote)
    part = part_path(models_dir / NAME)
    assert part.read_bytes() == model_bytes[:limit]
    assert json.loads(sidecar_path(models_dir / NAME).read_text())["synced"] == limit
    monkeypatch.undo()

    done = Downloader(models_dir, hub).download(remote)  # space freed: resume
    assert (done.resumed_from, done.path.read_bytes()) == (limit, model_bytes)


def test_two_downloads_run_at_once_and_a_split_model_brings_every_part(
        fake_hub: FakeHub, models_dir: Path, model_bytes: bytes,
        tiny_models: dict[str, Path]) -> None:
    """Both downloads are held mid-file by the server until both are there, so they
    overlap; a second writer of the same part is refused."""
    fake_hub.hold_at = 1 << 20
    fake_hub.hold_count = 2
    client = HubClient(Hub(fake_hub.url))
    split = client.details(REPO)
    parts = client.remote_files(split, split.group("Q8_0"))
    mamba = client.details("arbor-test/tiny-mamba-GGUF")
    [single] = client.remote_files(mamba, mamba.groups[0])
    downloader = Downloader(models_dir, client.hub)
    results: dict[str, object] = {}

    def run(key: str, remotes: list[RemoteFile]) -> None:
        try:
            results[key] = downloader.download_all(remotes)
        except Exception as exc:  # reported by the assertions below
            results[key] = exc

    threads = [threading.Thread(target=run, args=("split", parts)),
               threading.Thread(target=run, args=("mamba", [single]))]
    for t in threads:
        t.start()
    fake_hub.held.wait()  # both are mid-file at once
    with pytest.raises(DownloadBusyError):
        downloader.download(single)
    fake_hub.hold_at = None
    fake_hub.release.set()
    for t in threads:
        t.join()
    assert not isinstance(results["split"], Exception), results["split"]
    assert not isinstance(results["mamba"], Exception), results["mamba"]
    half = len(model_bytes) // 2
    assert (models_dir / parts[0].name).read_bytes() == model_bytes[:half]
    assert (models_dir / parts[1].name).read_bytes() == model_bytes[half:]
    assert (models_dir / single.name).read_bytes() == tiny_models["recurrent"].read_bytes()


def test_a_queue_runs_jobs_side_by_side_reports_them_and_cancels_one(
        fake_hub: FakeHub, models_dir: Path, model_bytes: bytes) -> None:
    fake_hub.hold_at = 1 << 20
    fake_hub.hold_count = 2
    client = HubClient(Hub(fake_hub.url))
    details = client.details(REPO)
    single = client.remote_files(details, details.group("F32"))
    split = client.remote_files(details, details.group("Q8_0"))
    events: list[JobEvent] = []
    finished: dict[int, JobEvent] = {}
    both_final = threading.Event()

    def on_event(event: JobEvent) -> None:  # on the queue's threads, as a signal would be
        events.append(event)
        if event.state.final:
            finished[event.job] = event
            if len(finished) == 2:
                both_final.set()

    queue = DownloadQueue(Downloader(models_dir, client.hub), on_event, parallel=2)
    first = queue.add(f"{REPO}:F32", single)
    second = queue.add(f"{REPO}:Q8_0", split)
    fake_hub.held.wait()  # both jobs are mid-file at once
    queue.cancel(first)
    fake_hub.hold_at = None
    fake_hub.release.set()
    both_final.wait()
    queue.close()

    assert finished[first].state is JobState.CANCELLED
    assert finished[second].state is JobState.DONE
    assert [d.path.name for d in finished[second].files] == [r.name for r in split]
    states = [e.state for e in events if e.job == second]
    assert states[0] is JobState.QUEUED and states[-1] is JobState.DONE
    shown = [e.progress for e in events if e.job == second and e.progress is not None]
    assert shown and shown[-1].done == shown[-1].total == split[-1].size
    assert [p.target.name for p in list_partial(models_dir)] == [NAME]  # kept to resume


def test_no_network_says_so_and_keeps_the_part(models_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    hub = Hub(closed)
    remote = RemoteFile(REPO, NAME, hub.resolve_url(REPO, NAME), 10 << 20, None)
    with pytest.raises(HubOfflineError, match="cannot reach"):
        Downloader(models_dir, hub, retry=FAST).download(remote)
    assert [p.remote.url for p in list_partial(models_dir)] == [remote.url]
    with pytest.raises(HubOfflineError):
        HubClient(hub).details(REPO)


def test_the_cli_names_a_bad_model_in_one_line(fake_hub: FakeHub) -> None:
    env = {**os.environ, "HF_ENDPOINT": fake_hub.url,
           "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
    for spec, message in [("not a repo", "not a Hugging Face repository name"),
                          ("arbor-test/missing", "no model repository"),
                          (f"{REPO}:Q2_K", "no single Q2_K model")]:
        result = subprocess.run([sys.executable, "-m", "engine", "pull", spec], cwd=ROOT,
                                env=env, capture_output=True, text=True)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    gated = subprocess.run([sys.executable, "-m", "engine", "pull", "arbor-test/gated-GGUF"],
                           cwd=ROOT, env=env, capture_output=True, text=True)
    assert gated.returncode == 1, gated.stderr
    assert "needs an access token" in gated.stderr.splitlines()[-1]
    found = subprocess.run([sys.executable, "-m", "engine", "search", "tiny"], cwd=ROOT,
                           env=env, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[0].startswith(f"{REPO}\t")
