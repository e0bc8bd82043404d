"""What the hub search, the remote header reader and the downloader share: where the hub is,
how a file's address is made, one HTTP client configuration, and the errors a user sees.

Hugging Face's documented endpoints are used as the hub answers them: a file is fetched from
`{endpoint}/{repo}/resolve/{revision}/{path}`, which redirects large (LFS) files to a CDN that
honours HTTP ranges; a gated repository answers 401 without a token and 403 when the token's
owner has not accepted its terms; a missing repository or file answers 404.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx

from engine.core.errors import ArborError, printable

DEFAULT_ENDPOINT = "https://huggingface.co"
ENDPOINT_ENV = "HF_ENDPOINT"  # the same override huggingface_hub reads (tests, mirrors)

# A repository id as the hub allows it: `owner/name`, letters, digits, `-`, `_`, `.`.
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")

# Connect and read bounds: a stalled server ends one attempt (the downloader retries), never
# the program. Large files stream, so there is no total timeout.
TIMEOUT = httpx.Timeout(connect=15.0, read=60.0, write=60.0, pool=15.0)


class HubError(ArborError):
    """Something between Arbor and the hub went wrong; the message says what to do."""


class HubOfflineError(HubError):
    """The hub cannot be reached (no network, DNS, a proxy, a firewall)."""


class HubNotFoundError(HubError):
    """No such repository, revision or file."""


class HubAccessError(HubError):
    """401/403: a gated or private repository, and no token or a token without access."""


class HubCancelledError(HubError):
    """The caller cancelled (its cancel event was set)."""


class BadRepoNameError(HubError):
    """A repository name that cannot be one (caught before asking the hub)."""


@dataclass(frozen=True)
class Hub:
    """Where the hub is and the access token to send (None: none). The token never appears
    in repr, logs or messages."""

    endpoint: str = field(default_factory=lambda: default_endpoint())
    token: str | None = field(default=None, repr=False)

    def resolve_url(self, repo: str, path: str, revision: str = "main") -> str:
        """The stable address of a file: the hub redirects it to wherever it is stored
        today, so this (not the redirect's target, which expires) is what a part records."""
        check_repo_id(repo)
        return (f"{self.endpoint}/{repo}/resolve/{quote(revision, safe='')}/"
                f"{quote(path, safe='/')}")

    def headers(self) -> dict[str, str]:
        """Headers for a request to the hub. httpx drops Authorization on a redirect to
        another host, so the CDN never sees the token."""
        headers = {"Accept-Encoding": "identity", "User-Agent": "arbor"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def client(self) -> httpx.Client:
        """A client for the hub and its CDN: redirects followed, proxies from the
        environment, bounded waits."""
        return httpx.Client(follow_redirects=True, timeout=TIMEOUT, headers=self.headers())


def default_endpoint() -> str:
    return os.environ.get(ENDPOINT_ENV, DEFAULT_ENDPOINT).rstrip("/")


def check_repo_id(repo: str) -> str:
    """`repo` if it can be a hub repository id; BadRepoNameError otherwise."""
    if not _REPO_ID.match(repo) or ".." in repo:
        raise BadRepoNameError(f"not a Hugging Face repository name: {printable(repo)} "
                               "(expected owner/name)")
    return repo


def raise_for_status(response: httpx.Response, repo: str, path: str | None = None) -> None:
    """A hub answer that is not a success, as the HubError a user can act on."""
    status = response.status_code
    if status < 400:
        return
    what = f"{repo}/{path}" if path else repo
    if status == 401:
        raise HubAccessError(
            f"{printable(what)} needs an access token: the repository is gated or private. "
            f"Accept its terms on the model's page ({DEFAULT_ENDPOINT}/{printable(repo)}), "
            "then set a Hugging Face access token (Settings, or $HF_TOKEN for "
            "arbor-engine)")
    if status == 403:
        raise HubAccessError(
            f"the access token cannot read {printable(what)}: accept the repository's terms "
            f"on its page ({DEFAULT_ENDPOINT}/{printable(repo)}) with the token's account, or "
            "use a token with read access")
    if status == 404:
        code = response.headers.get("x-error-code", "")
        if path and code != "RepoNotFound":
            raise HubNotFoundError(f"there is no file {printable(path)} in {printable(repo)}")
        raise HubNotFoundError(f"there is no model repository {printable(repo)} on the hub "
                               "(or it is private and the token cannot see it)")
    raise HubError(f"the hub answered {status} for {printable(what)}; try again later")


def offline_error(exc: Exception, endpoint: str) -> HubOfflineError:
    """The message for a hub that cannot be reached; the rest of Arbor works on."""
    reason = type(exc).__name__
    return HubOfflineError(
        f"cannot reach {printable(endpoint)} ({reason}): check the network connection; the "
        "models already downloaded still work offline")
