"""A local stand-in for the Hugging Face Hub, on 127.0.0.1, for tests without the internet.

It answers the endpoints Arbor uses as the hub documents them:

* `GET /api/models?search=&filter=gguf&sort=&limit=&expand=`: a JSON list of repositories;
* `GET /api/models/{repo}[/revision/{rev}]?blobs=true`: one repository with its files
  (`siblings`: `rfilename`, `size`, `lfs.sha256`), `gated`, `cardData.license`, `sha`;
  404 with `X-Error-Code: RepoNotFound` for an unknown one;
* `GET|HEAD /{repo}/resolve/{rev}/{path}`: 302 to the stored bytes with `X-Linked-Size`,
  `X-Linked-Etag` and `ETag`, as the hub redirects LFS files to its CDN; 401
  (`X-Error-Code: GatedRepo`) for a gated repository without the token, 404
  (`X-Error-Code: EntryNotFound`) for a missing file;
* `GET /cdn/{sha256}`: the bytes, honouring `Range` (206 + Content-Range, 416 past the end).

Faults a test switches on: `drop_every` (close the connection after that many body bytes of
each response), `hold_at` (stop sending at that file offset until `release` is set, having set
`held`), `corrupt_at` (flip the byte at that offset in what is served).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "hf_fake_token_for_tests_0123456789"
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


log = logging.getLogger(__name__)

@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated: bool = False
    license: str = "apache-2.0"
    downloads: int = 0
    trending: float = 0.0
    sha: str = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    range: str | None
    authorization: str | None


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    drop_every: int | None = None
    hold_at: int | None = None
    hold_count: int = 1  # how many responses must be held before `held` is set
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    corrupt_at: int | None = None
    url: str = ""
    _blobs: dict[str, bytes] = field(default_factory=dict)
    _holding: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_repo(self, repo: str, files: dict[str, bytes], **options: object) -> FakeRepo:
        made = FakeRepo(files=dict(files), **options)  # type: ignore[arg-type]
        self.repos[repo] = made
        for data in files.values():
            self._blobs[hashlib.sha256(data).hexdigest()] = data
        return made

    def cdn_requests(self) -> list[Request]:
        return [r for r in self.requests if r.path.startswith("/cdn/")]

    def _hold(self) -> None:
        with self._lock:
            self._holding += 1
            if self._holding >= self.hold_count:
                self.held.set()
        self.release.wait()


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (a cancelled download, a closed window) is what
    the tests do on purpose: not worth a traceback on stderr."""

    def handle_error(self, request: object, client_address: object) -> None:
        log.debug("fake hub: a client went away", exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, *, head: bool) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = parse_qs(parts.query)
        self.hub.requests.append(Request(self.command, path, query, self.headers.get("Range"),
                                         self.headers.get("Authorization")))
        if path == "/":
            return self._send(200, b"", head=head)
        if path == "/api/models":
            return self._json(self._search(query))
        if path.startswith("/api/models/"):
            rest = path.removeprefix("/api/models/").split("/")
            repo = "/".join(rest[:2])
            if repo not in self.hub.repos:
                return self._error(404, "RepoNotFound", "Repository not found")
            return self._json(self._info(repo))
        if path.startswith("/cdn/"):
            return self._blob(path.removeprefix("/cdn/"), head=head)
        match = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if match:
            return self._resolve(match.group(1), match.group(3), head=head)
        return self._error(404, "", "Not found")

    def _search(self, query: dict[str, list[str]]) -> list[dict[str, object]]:
        text = (query.get("search") or [""])[0].lower()
        wanted = query.get("filter") or []
        out = []
        for repo, info in self.hub.repos.items():
            if text and text not in repo.lower():
                continue
            if "gguf" in wanted and not any(f.endswith(".gguf") for f in info.files):
                continue
            out.append((repo, info))
        sort = (query.get("sort") or ["downloads"])[0]
        key = (lambda ri: ri[1].trending) if sort == "trendingScore" else (
            lambda ri: ri[1].downloads)
        out.sort(key=key, reverse=True)
        limit = int((query.get("limit") or ["1000"])[0])
        return [{"_id": repo, "id": repo, "downloads": info.downloads, "likes": 1,
                 "trendingScore": info.trending, "gated": "manual" if info.gated else False,
                 "tags": ["gguf", f"license:{info.license}"], "private": False,
                 "lastModified": "2026-01-02T03:04:05.000Z", "library_name": "gguf"}
                for repo, info in out[:limit]]

    def _info(self, repo: str) -> dict[str, object]:
        info = self.hub.repos[repo]
        siblings = []
        for name, data in info.files.items():
            sibling: dict[str, object] = {"rfilename": name, "size": len(data),
                                          "blobId": hashlib.sha1(data).hexdigest()}
            if name.endswith(".gguf"):
                sibling["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                  "pointerSize": 135}
            siblings.append(sibling)
        return {"_id": repo, "id": repo, "sha": info.sha, "private": False,
                "gated": "manual" if info.gated else False, "disabled": False,
                "downloads": info.downloads, "likes": 1,
                "tags": ["gguf", f"license:{info.license}"],
                "cardData": {"license": info.license}, "siblings": siblings}

    def _resolve(self, repo: str, name: str, *, head: bool) -> None:
        info = self.hub.repos.get(repo)
        if info is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        if info.gated:
            auth = self.headers.get("Authorization")
            if auth is None:
                return self._error(401, "GatedRepo", "Access to this model is restricted")
            if auth != f"Bearer {TOKEN}":
                return self._error(403, "GatedRepo", "Not in the authorized list")
        data = info.files.get(name)
        if data is None:
            return self._error(404, "EntryNotFound", "Entry not found")
        digest = hashlib.sha256(data).hexdigest()
        self.send_response(302)
        self.send_header("Location", f"{self.hub.url}/cdn/{digest}")
        self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("X-Linked-Etag", f'"{digest}"')
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _blob(self, digest: str, *, head: bool) -> None:
        data = self.hub._blobs.get(digest)
        if data is None:
            return self._error(404, "", "Not found")
        start, end = 0, len(data)
        status = 200
        header = self.headers.get("Range")
        if header:
            match = _RANGE.match(header)
            if not match:
                return self._error(400, "", "Bad range")
            start = int(match.group(1))
            end = min(int(match.group(2)) + 1 if match.group(2) else len(data), len(data))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{digest}"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if head:
            return None
        body = bytearray(data[start:end])
        hub = self.hub
        if hub.corrupt_at is not None and start <= hub.corrupt_at < end:
            body[hub.corrupt_at - start] ^= 0xFF
        self._stream(bytes(body), start)
        return None

    def _stream(self, body: bytes, start: int) -> None:
        hub = self.hub
        sent = 0
        limit = len(body) if hub.drop_every is None else min(len(body), hub.drop_every)
        if hub.hold_at is not None and start < hub.hold_at < start + len(body):
            limit = min(limit, hub.hold_at - start)
            holding = True
        else:
            holding = False
        try:
            while sent < limit:
                piece = body[sent: min(limit, sent + (64 << 10))]
                self.wfile.write(piece)
                sent += len(piece)
            self.wfile.flush()
            if holding:
                hub._hold()
        except (BrokenPipeError, ConnectionResetError):
            pass
        if sent < len(body):  # a dropped connection, mid-body
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def _json(self, value: object) -> None:
        self._send(200, json.dumps(value).encode(), content_type="application/json")

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send(self, status: int, body: bytes, *, head: bool = False,
              content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


class FakeHubServer:
    """The server in a thread; `hub` is its state."""

    def __init__(self) -> None:
        self.hub = FakeHub()
        handler = type("Handler", (_Handler,), {"hub": self.hub})
        self._server = _QuietServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.hub.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-hub",
                                        daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self.hub

    def __exit__(self, *exc: object) -> None:
        self.hub.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
