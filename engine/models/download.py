"""Downloads into the models folder that never lose a byte.

A file is written as `<name>.part` beside a small sidecar, `<name>.part.json` (the stable
hub URL, size, sha256, the server's ETag, the bytes known synced), so that whatever stops a
download (a dropped connection, Cancel, a killed process, a full disk) the next attempt asks
for the rest with an HTTP Range request instead of starting again:

* a dropped connection is retried at once from where it stopped, with a growing pause after
  each attempt that brought nothing (RetryPolicy); a server that no longer has the same file
  (another ETag) starts the part again rather than mixing two files;
* the sha256 is computed while writing (the part's existing bytes are hashed first on a
  resume), checked against the hub's LFS sha256 at the end; a mismatch deletes the part and
  says so;
* free disk space is checked before starting and while writing; a full disk (or ENOSPC from
  the write itself) stops with the part and its sidecar kept, to resume when space is free;
* only one writer per part (an advisory lock): the app and `arbor-engine pull` cannot both
  append to it;
* the finished file is fsynced, renamed into place, and its sha256 recorded in the model-hash
  cache (engine.models.files), so loading it does not hash gigabytes again.

`huggingface_hub` finds files and their sha256 (engine.models.hub); the bytes come through
httpx, because the hub's own downloader deletes its partial file when interrupted.

Here the Downloader: where a file goes, what is already there, one writer per part. The part
and its sidecar are `engine.models.download_parts`', the transfer itself is
`engine.models.download_transfer`'s.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from engine.core.errors import printable
from engine.files.atomic import make_folder
from engine.models.download_parts import (
    DownloadError,
    PartialDownload,
    RemoteFile,
    locked,
    part_path,
    sidecar_path,
)
from engine.models.download_transfer import Downloaded, ProgressCallback, Transfer
from engine.models.files import file_sha256
from engine.models.remote import Hub


@dataclass(frozen=True)
class RetryPolicy:
    """Retries after a dropped connection: at once when the attempt brought bytes, else
    after a pause that doubles from `first_pause` to `max_pause`, at most `attempts`
    fruitless attempts in a row."""

    attempts: int = 8
    first_pause: float = 0.5
    max_pause: float = 30.0


class Downloader:
    """Downloads hub files into `models_dir`. Thread-safe: several downloads may run at once
    (each on the caller's thread), one per target file."""

    def __init__(self, models_dir: Path, hub: Hub | None = None, *,
                 retry: RetryPolicy | None = None, cache_dir: Path | None = None) -> None:
        self.models_dir = models_dir
        self.hub = hub or Hub()
        self.retry = retry or RetryPolicy()
        self.cache_dir = cache_dir

    def download(self, remote: RemoteFile, *, progress: ProgressCallback | None = None,
                 cancel: threading.Event | None = None) -> Downloaded:
        """Fetch `remote` into the models folder, resuming its part if there is one.
        HubCancelledError when `cancel` is set (the part is kept); DownloadError and the
        other HubErrors say what stopped it and whether the part was kept."""
        cancel = cancel or threading.Event()
        target = self.models_dir / remote.name
        if remote.name in ("", ".", "..") or "\\" in remote.name or \
                target.parent != self.models_dir:
            raise DownloadError(f"not a file name to download to: {printable(remote.path)}")
        make_folder(self.models_dir)
        done = self._already_there(target, remote)
        if done is not None:
            return done
        with locked(part_path(target)) as fd:
            if target.exists():  # finished by another download while this one waited
                part_path(target).unlink(missing_ok=True)
                sidecar_path(target).unlink(missing_ok=True)
                done = self._already_there(target, remote)
                assert done is not None
                return done
            return Transfer(self, remote, target, fd, progress, cancel).run()

    def download_all(self, remotes: list[RemoteFile], *,
                     progress: ProgressCallback | None = None,
                     cancel: threading.Event | None = None) -> list[Downloaded]:
        """Every file of a model (a split model's parts), one after the other."""
        return [self.download(r, progress=progress, cancel=cancel) for r in remotes]

    def resume(self, partial: PartialDownload, *, progress: ProgressCallback | None = None,
               cancel: threading.Event | None = None) -> Downloaded:
        return self.download(partial.remote, progress=progress, cancel=cancel)

    def _already_there(self, target: Path, remote: RemoteFile) -> Downloaded | None:
        """A finished file of that name: done if it is this one; an error if it is not."""
        if not target.exists():
            return None
        size = target.stat().st_size
        if remote.size is not None and size != remote.size:
            raise DownloadError(f"a different {printable(remote.name)} is already in the "
                                f"models folder ({size} bytes, not {remote.size}); move it "
                                "away to download this one")
        digest = file_sha256(target, self.cache_dir)
        if remote.sha256 is not None and digest != remote.sha256:
            raise DownloadError(f"a different {printable(remote.name)} is already in the "
                                "models folder (another sha256); move it away to download "
                                "this one")
        return Downloaded(target, size, digest, size, 0, 0)


__all__ = ["Downloader", "RetryPolicy"]
