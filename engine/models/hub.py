"""Finding GGUF models on Hugging Face: search, a repository's quantizations, and whether one
fits this machine, read from its header before anything is downloaded.

Plain blocking calls for a worker thread (the window wraps them in signals; the command line
calls them directly). Each takes a `cancel` event, checked between requests; a cancelled
call raises HubCancelledError, and a window may also just drop a result it no longer wants.
Search and metadata go through `huggingface_hub` (`HfApi.list_models` with the `gguf` filter,
`HfApi.model_info` with file metadata, which carries each file's LFS sha256); headers and
downloads through httpx (engine.models.remote_header, engine.models.download).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

import httpx

from engine.core.errors import printable
from engine.models.download_parts import RemoteFile
from engine.models.fit import Fit, check_fit, shape_of
from engine.models.quants import QuantGroup, RepoFile, group_files, pick_group
from engine.models.remote import (
    BadRepoNameError,
    Hub,
    HubAccessError,
    HubCancelledError,
    HubError,
    HubNotFoundError,
    check_repo_id,
    offline_error,
)
from engine.models.remote_header import RemoteHeader, read_remote_header

log = logging.getLogger(__name__)

T = TypeVar("T")
SEARCH_LIMIT = 30
PROBE_TIMEOUT = httpx.Timeout(10.0)
# What a search result carries besides its id (the list API's `expand`).
_EXPAND = ["downloads", "likes", "trendingScore", "gated", "tags", "lastModified"]


class SortOrder(StrEnum):
    DOWNLOADS = "downloads"
    TRENDING = "trending_score"
    LIKES = "likes"
    RECENT = "last_modified"


@dataclass(frozen=True)
class RepoSummary:
    """One search result."""

    repo: str
    downloads: int
    likes: int
    trending: float
    gated: bool
    license: str | None
    last_modified: datetime | None


@dataclass(frozen=True)
class RepoDetails:
    """A repository's GGUF models: one group per quantization, smallest first."""

    repo: str
    revision: str  # the commit the files were listed at; downloads fetch from it
    license: str | None
    gated: bool  # the hub will ask for a token (and accepted terms) to download
    private: bool
    groups: tuple[QuantGroup, ...]

    def group(self, quant: str | None) -> QuantGroup:
        """The group named `quant` (None: the default quantization), or HubNotFoundError
        naming the choices."""
        found = pick_group(list(self.groups), quant)
        if found is not None:
            return found
        names = ", ".join(g.quant for g in self.groups if g.complete) or "none"
        if quant is None:
            raise HubNotFoundError(f"{self.repo} has several models: name one as "
                                   f"{self.repo}:QUANT (one of: {printable(names)})")
        raise HubNotFoundError(f"{self.repo} has no single {printable(quant)} model "
                               f"(it has: {printable(names)})")


class HubClient:
    """Search, repository details and remote headers on one hub (endpoint and token)."""

    def __init__(self, hub: Hub | None = None) -> None:
        self.hub = hub or Hub()

    def _api(self) -> Any:
        from huggingface_hub import HfApi  # imported on use: the app starts without it

        return HfApi(endpoint=self.hub.endpoint, token=self.hub.token or False,
                     library_name="arbor")

    def search(self, text: str, *, sort: SortOrder = SortOrder.DOWNLOADS,
               limit: int = SEARCH_LIMIT, cancel: threading.Event | None = None
               ) -> list[RepoSummary]:
        """GGUF repositories whose name matches `text` (all of them when empty), best
        first by `sort`."""
        self._probe(cancel)
        found = self._call(lambda: self._api().list_models(
            filter="gguf", search=text.strip() or None, sort=sort.value, limit=limit,
            expand=_EXPAND), cancel)
        out: list[RepoSummary] = []
        for info in self._each(found, cancel):
            tags = list(info.tags or [])
            out.append(RepoSummary(
                repo=info.id, downloads=int(info.downloads or 0), likes=int(info.likes or 0),
                trending=float(getattr(info, "trending_score", None) or 0.0),
                gated=bool(info.gated), license=_license(tags, None),
                last_modified=info.last_modified,
            ))
        return out

    def details(self, repo: str, *, revision: str = "main",
                cancel: threading.Event | None = None) -> RepoDetails:
        """The repository's GGUF files grouped by quantization, with sizes and sha256."""
        check_repo_id(repo)
        self._check(cancel)
        info = self._call(lambda: self._api().model_info(
            repo, revision=revision, files_metadata=True), cancel, repo)
        files = [
            RepoFile(path=s.rfilename, size=s.lfs.size if s.lfs else s.size,
                     sha256=s.lfs.sha256 if s.lfs else None)
            for s in (info.siblings or [])
        ]
        card = getattr(info, "card_data", None)
        card_license = getattr(card, "license", None) if card is not None else None
        return RepoDetails(
            repo=info.id or repo, revision=info.sha or revision,
            license=_license(list(info.tags or []), card_license),
            gated=bool(info.gated), private=bool(info.private),
            groups=tuple(group_files(files)),
        )

    def header(self, details: RepoDetails, group: QuantGroup,
               cancel: threading.Event | None = None) -> RemoteHeader:
        """The header of the group's first file (a split model keeps it in part 1)."""
        return read_remote_header(self.hub, details.repo, group.first.path, details.revision,
                                  cancel)

    def remote_files(self, details: RepoDetails, group: QuantGroup) -> list[RemoteFile]:
        """What to download for a group: every part, from the listed commit."""
        return [RemoteFile(details.repo, f.path,
                           self.hub.resolve_url(details.repo, f.path, details.revision),
                           f.size, f.sha256)
                for f in group.files]

    def _probe(self, cancel: threading.Event | None) -> None:
        """One quick request, so that no network says so in seconds: huggingface_hub's list
        call retries a refused connection for about half a minute."""
        self._check(cancel)
        try:
            httpx.head(self.hub.endpoint, timeout=PROBE_TIMEOUT, follow_redirects=False)
        except httpx.TransportError as exc:
            raise offline_error(exc, self.hub.endpoint) from exc
        self._check(cancel)

    def _check(self, cancel: threading.Event | None) -> None:
        if cancel is not None and cancel.is_set():
            raise HubCancelledError("cancelled")

    def _call(self, action: Callable[[], T], cancel: threading.Event | None,
              repo: str | None = None) -> T:
        """`action` with the hub's errors as HubErrors."""
        self._check(cancel)
        try:
            return action()
        except Exception as exc:
            raise self._translate(exc, repo) from exc

    def _each(self, items: Iterable[T], cancel: threading.Event | None) -> Iterable[T]:
        iterator = iter(items)
        while True:
            self._check(cancel)
            try:
                item = next(iterator)
            except StopIteration:
                return
            except Exception as exc:
                raise self._translate(exc, None) from exc
            yield item

    def _translate(self, exc: Exception, repo: str | None) -> Exception:
        from huggingface_hub import errors

        what = printable(repo) if repo else "the hub"
        if isinstance(exc, HubError):
            return exc
        if isinstance(exc, errors.GatedRepoError):
            return HubAccessError(f"{what} is gated: accept its terms on its page and set a "
                                  "Hugging Face access token (Settings, or $HF_TOKEN for "
                                  "arbor-engine)")
        if isinstance(exc, errors.RepositoryNotFoundError | errors.RevisionNotFoundError):
            return HubNotFoundError(f"there is no model repository {what} on the hub (or it "
                                    "is private and the token cannot see it)")
        if isinstance(exc, errors.HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else None
            if status in (401, 403):
                return HubAccessError(f"the hub refused access to {what} ({status}): check "
                                      "the Hugging Face token")
            return HubError(f"the hub answered {status} for {what}; try again later")
        if isinstance(exc, errors.HFValidationError):
            return BadRepoNameError(f"not a Hugging Face repository name: {what}")
        if _is_transport_error(exc):
            return offline_error(exc, self.hub.endpoint)
        return exc


def _is_transport_error(exc: Exception) -> bool:
    """A network failure from whichever HTTP stack huggingface_hub uses (httpx, its fork
    httpx2, or requests in older versions), matched by where the class comes from."""
    if isinstance(exc, httpx.TransportError | ConnectionError | TimeoutError):
        return True
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] in ("httpx2", "requests", "urllib3") and cls.__name__ in (
                "TransportError", "ConnectionError", "Timeout", "NewConnectionError"):
            return True
    return False


def _license(tags: list[str], card: object) -> str | None:
    if isinstance(card, str) and card:
        return card
    for tag in tags:
        if tag.startswith("license:"):
            return tag.removeprefix("license:")
    return None


def parse_model_spec(spec: str) -> tuple[str, str | None]:
    """`owner/name[:QUANT]` as (repo, quant); a full hub URL's `owner/name` part is taken
    too. BadRepoNameError for anything else."""
    text = spec.strip()
    for prefix in ("https://huggingface.co/", "http://huggingface.co/", "hf.co/",
                   "huggingface.co/"):
        if text.startswith(prefix):
            text = "/".join(text.removeprefix(prefix).split("/")[:2])
    repo, _, quant = text.partition(":")
    check_repo_id(repo)
    if quant and not all(c.isalnum() or c in "_-" for c in quant):
        raise BadRepoNameError(f"not a quantization name: {printable(quant)}")
    return repo, quant or None


def fit_of(header: RemoteHeader, weights: int, n_ctx: int, *, free_ram: int,
           checkpoint_budget: int, free_vram: int | None = None, type_k: str = "f16",
           type_v: str = "f16", flash_attn: bool = False) -> Fit:
    """Whether the model of `header` (whose files weigh `weights` bytes) fits."""
    return check_fit(shape_of(header.fields), weights, n_ctx, free_ram=free_ram,
                     checkpoint_budget=checkpoint_budget, free_vram=free_vram,
                     type_k=type_k, type_v=type_v, flash_attn=flash_attn)
