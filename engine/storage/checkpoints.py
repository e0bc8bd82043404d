"""Checkpoints: saved per-sequence engine state after a known prefix of tokens.

A checkpoint holds the exact tokens its state covers and the chunk ends they were decoded with,
so it is valid for a target exactly when those tokens are a prefix of the target and those ends
are the target's decode schedule up to there (`engine.core.schedule`); the first is the same as "on
the target's path in the tree", since a path's tokens are its nodes' tokens. It is attached to
the tree node that holds its last token, so deleting the node frees it.

A checkpoint taken at a prompt's end also keeps the logits of its last token (n_vocab float32),
which saved llama.cpp state does not hold: a target that ends exactly there (a regenerate, a
swipe) restores it and samples from them without decoding anything.

The store keeps checkpoints in RAM under a budget (blob and logits counted) and spills the least
valuable ones to a disk tier before dropping anything. Every blob carries the identity of the
context that made it; a disk file is also signed with the installation's key
(`engine.storage.keyfile`): an HMAC over its header, which holds the sha256 of the blob and of
the logits. A file whose tag, identity or checksums do not match is removed and never handed
to llama.cpp: its state loader is not safe on foreign bytes, and anyone who can write the cache
folder could otherwise choose what it loads (or which token a reply starts with).

A partial checkpoint (`PARTIAL_ONLY`) holds only the part of the state that cannot be cut
back: the recurrent part of a hybrid whose attention layers see the whole context, the window
layers' cache of a sliding-window model. A hybrid's is a few hundred KiB against an attention
cache that grows with every token. It is valid only with the live context's other layers,
which must hold the same prefix decoded with the same chunk ends (engine.llm.runtime checks);
so it lives in RAM alone, is never spilled, exported or read from a file, and a whole state of
the same prefix replaces it.

Every checkpoint also carries its cache scope: whose requests made it ("" for the window, one
scope per API `user`). A checkpoint serves only requests of its own scope, so what a request
reuses (and so `cached_tokens` and the time it takes) never tells one client of another's
messages.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import logging
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

from engine.core.prefix import TOKEN_BYTES, packed
from engine.core.schedule import Schedule
from engine.files.atomic import atomic_writer
from engine.files.regular import FormatError, open_regular
from engine.files.strict_json import dumps_strict, loads_strict

log = logging.getLogger(__name__)

_ids = itertools.count(1)
_FILE_MAGIC = b"ARBORCKP"
# 2: the chunk ends ("bounds"); 3: the HMAC tag; 4: the prompt end's logits after the blob.
# Version 3 files are read as checkpoints without logits; files of other versions are
# discarded.
_FILE_VERSION = 4
_READ_VERSIONS = (3, 4)
_PREFIX = struct.Struct("<8sII")  # magic, version, header length; then the tag, header, blob
_TAG_BYTES = 32
_HEADER_LIMIT = 1 << 26
# Spills: written this many bytes at a time, checking between pieces whether a request waits
# (16 MiB: about 15 ms here); RAM may run 1/SPILL_SLACK over the budget while they give way.
SPILL_PIECE = 16 << 20
SPILL_SLACK = 4
MAX_SCOPE_CHARS = 256  # a scope is a short name ("api:" and a sha256 for the API's)
# llama.cpp's LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the state without the attention cache
PARTIAL_ONLY = 1


@dataclass(frozen=True)
class Identity:
    """Everything that must match for a state blob to be loadable into a context."""

    model_sha256: str
    llama_cpp_python: str
    n_ctx: int
    n_batch: int
    type_k: str
    type_v: str
    flash_attn: str
    swa_full: bool
    n_seq_max: int = 1  # Arbor's sequence layout: one sequence, id 0
    flags: int = 0
    # Where the layers ran: "cpu", a GPU backend, and any RPC workers. A remote GPU does not
    # give the CPU's bits, and a state's tensors are laid out per device.
    devices: str = "cpu"
    # The CPU kernels: llama.cpp's CPU library and whether weights were repacked for it
    # (engine.llm.backends, engine.llm.repack). Other kernels, other bits.
    kernels: str = ""

    def key(self) -> str:
        """A short stable name for this identity (the disk tier's folder)."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True, eq=False)
class Checkpoint:
    tokens: tuple[int, ...]  # the prefix the state covers: positions 0..len-1
    blob: bytes | bytearray | None  # the state (never mutated); None while only on disk
    # The chunk ends the state was decoded with; the last is len(tokens). Empty: unknown,
    # never restored.
    bounds: tuple[int, ...] = ()
    flags: int = 0
    node_id: int | None = None
    id: int = field(default_factory=lambda: next(_ids))
    size: int = -1  # bytes of the blob; set from the blob when not given
    # Whose requests made it ("" the window's): it serves only requests of the same scope.
    scope: str = ""
    # The logits of its last token (n_vocab float32, little-endian), when that token ended
    # a prompt: a target that ends here is then sampled from them with nothing decoded.
    # None while only on disk, or when none were kept (interior chunk ends, old files).
    logits: bytes | None = None
    logits_size: int = -1  # bytes of the logits; set from them when not given (0: none)
    # `tokens`, packed (engine.core.prefix): what prefix tests and lookups compare.
    key: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", packed(self.tokens))
        if self.size < 0:
            object.__setattr__(self, "size", len(self.blob or b""))
        if self.logits_size < 0:
            object.__setattr__(self, "logits_size", len(self.logits or b""))

    @property
    def partial(self) -> bool:
        """Whether it holds the recurrent part alone (see the module's docstring)."""
        return bool(self.flags & PARTIAL_ONLY)

    @property
    def has_logits(self) -> bool:
        """Whether it was kept with its last token's logits (in RAM or on disk)."""
        return self.logits_size > 0

    @property
    def footprint(self) -> int:
        """The bytes it holds, for the budgets: the state blob and the logits."""
        return self.size + self.logits_size

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def pos_max(self) -> int:
        return len(self.tokens) - 1

    def is_prefix_of(self, target: bytes) -> bool:
        """Whether its tokens begin `target` (`packed`)."""
        return target.startswith(self.key)

    def fits(self, target: bytes, schedule: Schedule) -> bool:
        """Whether restoring this and decoding the rest of `target` (`packed`) by
        `schedule` gives exactly the state a full decode by `schedule` gives: a prefix
        decoded with the schedule's own chunk ends, leaving at least the last chunk to
        decode, or all of `target` when it holds the logits to sample the next token from."""
        length = len(target) // TOKEN_BYTES
        return (
            (self.n_tokens < length or (self.n_tokens == length and self.has_logits))
            and schedule.agrees(self.bounds)
            and self.is_prefix_of(target)
        )


# --- the store -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreStats:
    count: int
    ram_count: int
    disk_count: int
    ram_bytes: int
    disk_bytes: int
    ram_budget: int
    disk_budget: int
    created: int
    restored: int
    rejected: int


def default_ram_budget() -> int:
    """An eighth of physical memory, between 256 MiB and 4 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return max(256 << 20, min(4 << 30, total // 8))


@dataclass
class _Entry:
    checkpoint: Checkpoint
    last_used: float
    path: Path | None = None  # on disk when set
    in_ram: bool = True
    # Inside a message (`plan_inner`): evicted before any other, and dropped, never spilled
    # (as a partial checkpoint is: it is nothing without the live cache).
    inner: bool = False
    file_bytes: int = 0  # the size of its file on disk: header, blob and logits


class CheckpointStore:
    """The checkpoints of one context identity: a RAM tier, an optional disk tier.

    `key` signs and verifies the disk tier's files (`engine.storage.keyfile.installation_key`); a
    store without one has no disk tier."""

    def __init__(
        self,
        identity: Identity,
        *,
        key: bytes | None = None,
        ram_budget: int | None = None,
        disk_dir: Path | None = None,
        disk_budget: int = 8 << 30,
    ) -> None:
        self.identity = identity
        self._key = key
        self.ram_budget = default_ram_budget() if ram_budget is None else ram_budget
        self.disk_budget = disk_budget
        self._disk = self._tier(disk_dir)
        self._entries: dict[int, _Entry] = {}
        self._protected: set[int] = set()
        self.created = self.restored = self.rejected = 0
        if self._disk is not None:
            self._load_disk_index()

    # --- queries ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def all(self) -> list[Checkpoint]:
        return [e.checkpoint for e in self._entries.values()]

    def candidates(self, target: Sequence[int], schedule: Schedule, *, scope: str = ""
                   ) -> list[Checkpoint]:
        """Every checkpoint of `scope` that fits `target` decoded by `schedule`, deepest
        first. Another scope's never: what it holds is another client's."""
        key = packed(target)
        found = [e.checkpoint for e in self._entries.values()
                 if e.checkpoint.scope == scope and e.checkpoint.fits(key, schedule)]
        found.sort(key=lambda c: c.n_tokens, reverse=True)
        return found

    def nodes_with_checkpoints(self) -> dict[int, str]:
        """node id -> "ram" or "disk", for the tree panel."""
        out: dict[int, str] = {}
        for entry in self._entries.values():
            node = entry.checkpoint.node_id
            if node is not None and out.get(node) != "ram":
                out[node] = "ram" if entry.in_ram else "disk"
        return out

    def inner(self) -> list[Checkpoint]:
        """The checkpoints inside messages (`plan_inner`)."""
        return [e.checkpoint for e in self._entries.values() if e.inner]

    def inner_room(self) -> int:
        """Bytes of the RAM budget that the checkpoints other than inner ones leave free."""
        used = sum(e.checkpoint.footprint for e in self._entries.values()
                   if e.in_ram and not e.inner)
        return max(0, self.ram_budget - used)

    def largest(self, *, partial: bool = False) -> int:
        """The size of the largest whole (or `partial`) state in RAM (0 when none): what the
        next inner checkpoint of this context may cost (inner ones keep no logits), to size
        them by."""
        return max((e.checkpoint.size for e in self._entries.values()
                    if e.in_ram and e.checkpoint.partial == partial), default=0)

    def stats(self) -> StoreStats:
        ram = [e for e in self._entries.values() if e.in_ram]
        disk = [e for e in self._entries.values() if e.path is not None]
        return StoreStats(
            count=len(self._entries),
            ram_count=len(ram),
            disk_count=len(disk),
            ram_bytes=sum(e.checkpoint.footprint for e in ram),
            disk_bytes=sum(e.path.stat().st_size for e in disk if e.path and e.path.exists()),
            ram_budget=self.ram_budget,
            disk_budget=self.disk_budget if self._disk is not None else 0,
            created=self.created,
            restored=self.restored,
            rejected=self.rejected,
        )

    # --- changes ---------------------------------------------------------------------

    def add(self, checkpoint: Checkpoint, *, inner: bool = False) -> None:
        """Keep a new checkpoint in RAM. The budget is enforced later, by `enforce_budget`,
        so that creation costs no more than the copy already made.

        An `inner` one (`plan_inner`) is kept only in the room the others leave: inner
        checkpoints over the budget are dropped at once, the least valuable first (they
        come many to a message, and dropping costs nothing). Of two checkpoints of the same
        state and kind (whole or partial) the one with logits is kept. A partial one is kept
        beside a whole one of the same state: it restores that state in a fraction of the
        time while the live cache holds its prefix (a hybrid's prompt end: `twin_end`), and
        the whole one after the cache moved."""
        if not valid_bounds(checkpoint.bounds, checkpoint.n_tokens):
            raise ValueError("a checkpoint without its chunk ends can never be restored")
        for entry in list(self._entries.values()):
            held = entry.checkpoint
            if (held.key, held.bounds, held.scope, held.partial) == (
                checkpoint.key, checkpoint.bounds, checkpoint.scope, checkpoint.partial
            ):
                if held.has_logits >= checkpoint.has_logits:
                    entry.last_used = time.monotonic()
                    entry.inner = entry.inner and inner  # a message end there too: keep it so
                    return  # the same state is already kept
                inner = inner and entry.inner
                self.drop(held.id)  # the same state with logits: keep the new one
                break
        self._entries[checkpoint.id] = _Entry(checkpoint, time.monotonic(), inner=inner)
        self.created += 1
        if inner:
            self._trim_inner()

    def fetch(self, checkpoint: Checkpoint) -> Checkpoint | None:
        """The checkpoint with its blob, read and verified from disk if needed."""
        entry = self._entries.get(checkpoint.id)
        if entry is None:
            return None
        entry.last_used = time.monotonic()
        if entry.in_ram:
            return entry.checkpoint
        assert entry.path is not None
        loaded = self._read_file(entry.path)
        if loaded is None or (
            loaded.key, loaded.bounds, loaded.scope, loaded.logits_size
        ) != (checkpoint.key, checkpoint.bounds, checkpoint.scope, checkpoint.logits_size):
            self.reject(checkpoint.id)
            return None
        return replace(checkpoint, blob=loaded.blob, logits=loaded.logits)

    def mark_restored(self, checkpoint_id: int) -> None:
        self.restored += 1
        entry = self._entries.get(checkpoint_id)
        if entry is not None:
            entry.last_used = time.monotonic()

    def reject(self, checkpoint_id: int) -> None:
        """Drop a checkpoint that failed to restore or verify."""
        self.rejected += 1
        self.drop(checkpoint_id)

    def drop(self, checkpoint_id: int) -> None:
        entry = self._entries.pop(checkpoint_id, None)
        if entry is not None and entry.path is not None:
            _remove(entry.path)

    def drop_nodes(self, node_ids: Iterable[int]) -> int:
        """Free the checkpoints of deleted nodes. Returns how many went."""
        gone = set(node_ids)
        doomed = [i for i, e in self._entries.items() if e.checkpoint.node_id in gone]
        for checkpoint_id in doomed:
            self.drop(checkpoint_id)
        return len(doomed)

    def protect(self, node_ids: Iterable[int]) -> None:
        """The active branch: its checkpoints are evicted last."""
        self._protected = set(node_ids)

    def enforce_budget(self, yield_to: Callable[[], bool] | None = None) -> None:
        """Move the least valuable checkpoints out of RAM: to disk if there is a disk tier,
        else away. Value: on the active branch, then recently used, then costly to redo.

        `yield_to`: true when a request waits. Then the spills stop, in the middle of one if
        need be (its file is not kept), as long as RAM is at most a quarter over the budget
        (SPILL_SLACK): the rest waits for the next call. Writing a KV cache of 190 MB (SmolLM2
        at 8k tokens) takes 0.3-0.8 s here, which a swipe sent meanwhile waited for."""
        ram = [e for e in self._entries.values() if e.in_ram]
        used = sum(e.checkpoint.footprint for e in ram)
        if used <= self.ram_budget:
            return
        limit = self.ram_budget + self.ram_budget // SPILL_SLACK

        def waits() -> bool:
            return yield_to is not None and used <= limit and yield_to()

        ram.sort(key=self._value)
        for entry in ram:
            if used <= self.ram_budget or waits():
                break
            try:
                self._evict(entry, waits)
            except _Yielded:
                break
            used -= entry.checkpoint.footprint
        self._enforce_disk_budget()

    def configure(self, *, ram_budget: int | None, disk_dir: Path | None) -> None:
        """New settings, applied at once. Turning the disk tier off removes its files (they
        are a cache: the conversations never depend on them); turning it on offers what a
        previous run left there."""
        self.ram_budget = default_ram_budget() if ram_budget is None else ram_budget
        wanted = self._tier(disk_dir)
        if wanted != self._disk:
            for checkpoint_id, entry in list(self._entries.items()):
                if entry.path is None:
                    continue
                _remove(entry.path)
                entry.path = None
                if not entry.in_ram:
                    del self._entries[checkpoint_id]
            self._disk = wanted
            if self._disk is not None:
                self._load_disk_index()
        self.enforce_budget()

    # --- internals -------------------------------------------------------------------

    def _tier(self, disk_dir: Path | None) -> Path | None:
        if disk_dir is None:
            return None
        if self._key is None:
            raise ValueError("a disk tier needs the installation key to sign its files")
        return disk_dir / self.identity.key()

    def _value(self, entry: _Entry) -> tuple[bool, bool, float, int]:
        return (not entry.inner, entry.checkpoint.node_id in self._protected, entry.last_used,
                entry.checkpoint.n_tokens)

    def _trim_inner(self) -> None:
        """Drop inner checkpoints, the least valuable first, while RAM is over the budget."""
        ram = [e for e in self._entries.values() if e.in_ram]
        used = sum(e.checkpoint.footprint for e in ram)
        for entry in sorted((e for e in ram if e.inner), key=self._value):
            if used <= self.ram_budget:
                break
            used -= entry.checkpoint.footprint
            self.drop(entry.checkpoint.id)

    def _evict(self, entry: _Entry, waits: Callable[[], bool] = lambda: False) -> None:
        """Out of RAM: to disk, or away. Raises _Yielded, changing nothing, when `waits()`
        turns true while its file is written."""
        checkpoint = entry.checkpoint
        if entry.inner or checkpoint.partial:  # cheap to lose, or useless from disk
            del self._entries[checkpoint.id]
            return
        if self._disk is not None and entry.path is None:
            try:
                entry.path, entry.file_bytes = self._write_file(checkpoint, waits)
            except OSError as exc:
                log.warning("cannot write checkpoint %d to disk (%s)", checkpoint.id, exc)
        if entry.path is None:
            del self._entries[checkpoint.id]
            return
        entry.in_ram = False
        entry.checkpoint = replace(checkpoint, blob=None, logits=None)  # sizes are kept

    def _enforce_disk_budget(self) -> None:
        on_disk = [e for e in self._entries.values() if e.path is not None and not e.in_ram]
        used = sum(e.file_bytes for e in on_disk)  # the headers' token lists included
        on_disk.sort(key=self._value)
        for entry in on_disk:
            if used <= self.disk_budget:
                break
            used -= entry.file_bytes
            self.drop(entry.checkpoint.id)

    def _write_file(self, checkpoint: Checkpoint, waits: Callable[[], bool] = lambda: False
                    ) -> tuple[Path, int]:
        """One file per checkpoint: `file_head`, the JSON header, the blob, the logits (if
        any). Written to a temp file, fsynced, then renamed into place. Its path and size.
        Hashed and written SPILL_PIECE bytes at a time; when `waits()` turns true between
        two, raises _Yielded and leaves no file."""
        assert self._disk is not None and self._key is not None and checkpoint.blob is not None
        assert not checkpoint.partial, "a partial state is nothing without the live cache"
        logits = checkpoint.logits or b""
        blob = memoryview(checkpoint.blob)
        digest = hashlib.sha256()
        for piece in _pieces(blob, waits):
            digest.update(piece)
        header = dumps_strict({
            "identity": asdict(self.identity),
            "tokens": list(checkpoint.tokens),
            "bounds": list(checkpoint.bounds),
            "flags": checkpoint.flags,
            "scope": checkpoint.scope,
            "size": checkpoint.size,
            "sha256": digest.hexdigest(),
            "logits_size": len(logits),
            "logits_sha256": hashlib.sha256(logits).hexdigest(),
        })
        final = self._disk / f"{checkpoint.id}-{int(time.time() * 1e6)}.ckpt"
        head = file_head(self._key, header)
        with atomic_writer(final) as f:
            f.write(head)
            f.write(header)
            for piece in _pieces(blob, waits):
                f.write(piece)
            f.write(logits)
        return final, len(head) + len(header) + len(blob) + len(logits)

    def _read_file(self, path: Path, *, with_blob: bool = True) -> Checkpoint | None:
        """Read and verify a disk checkpoint; None (and a log line) if anything is off.

        The header is trusted only after its tag checks out with this installation's key,
        and only for this identity. It holds the sizes of the blob and the logits, which
        must be exactly what follows it, and their sha256: they are handed out only when
        they match, so they are the very bytes that header was written with. Without the
        blob (the index at start-up) all but the sha256s is checked. A file of version 3
        has no logits."""
        assert self._key is not None
        try:
            if path.is_symlink():  # whatever it points at is not one of the tier's files
                raise OSError("a symbolic link")
            with open_regular(path) as f:
                length = os.fstat(f.fileno()).st_size
                header = self._read_header(f, self._key, length)
                size, digest = header["size"], header["sha256"]
                n_logits = header.get("logits_size", 0)
                if size + n_logits != length - f.tell():
                    raise ValueError(f"{length - f.tell()} bytes follow the header, not "
                                     f"{size} + {n_logits}")
                blob = f.read(size) if with_blob else None
                logits = f.read(n_logits) if with_blob and n_logits else None
            if blob is not None and (
                len(blob) != size or hashlib.sha256(blob).hexdigest() != digest
            ):
                raise ValueError("the blob does not match its checksum")
            if logits is not None and (
                len(logits) != n_logits
                or hashlib.sha256(logits).hexdigest() != header["logits_sha256"]
            ):
                raise ValueError("the logits do not match their checksum")
            return Checkpoint(
                tokens=tuple(header["tokens"]), blob=blob, bounds=tuple(header["bounds"]),
                flags=header["flags"], size=size, scope=header.get("scope", ""),
                logits=logits, logits_size=n_logits,
            )
        except (OSError, ValueError, FormatError) as exc:
            log.warning("discarding checkpoint file %s: %s", path.name, exc)
            return None

    def _read_header(self, f: BinaryIO, key: bytes, length: int) -> dict[str, Any]:
        """The header of a file of `length` bytes, after its tag and every field's type."""
        head = f.read(_PREFIX.size + _TAG_BYTES)
        if len(head) != _PREFIX.size + _TAG_BYTES or not head.startswith(_FILE_MAGIC):
            raise ValueError("not an Arbor checkpoint file")
        _, version, header_len = _PREFIX.unpack_from(head)
        if version not in _READ_VERSIONS:
            raise ValueError(f"unsupported checkpoint file (version {version})")
        if header_len > min(_HEADER_LIMIT, length - len(head)):
            raise ValueError(f"a header of {header_len} bytes does not fit the file")
        data = f.read(header_len)
        if not hmac.compare_digest(file_head(key, data, version), head):
            raise ValueError("not signed with this installation's key")
        header = loads_strict(data, max_bytes=_HEADER_LIMIT)
        if not isinstance(header, dict):
            raise ValueError("the header is not an object")
        if header.get("identity") != asdict(self.identity):
            raise ValueError("made by another model or context configuration")
        tokens = header.get("tokens")
        if not isinstance(tokens, list) or not tokens or not all(
            _is_int(t) and 0 <= t < 1 << 31 for t in tokens
        ):
            raise ValueError("bad token list")
        if not valid_bounds(header.get("bounds"), len(tokens)):
            raise ValueError("bad chunk ends")
        size, flags = header.get("size"), header.get("flags")
        if not _is_int(size) or size < 0 or not (_is_int(flags) and 0 <= flags < 1 << 32):
            raise ValueError("bad size or flags")
        if flags & PARTIAL_ONLY:  # never written: the live cache it needs is gone
            raise ValueError("a partial state")
        if not isinstance(header.get("sha256"), str):
            raise ValueError("bad checksum field")
        scope = header.get("scope", "")  # files written before scopes are the window's
        if not isinstance(scope, str) or len(scope) > MAX_SCOPE_CHARS:
            raise ValueError("bad scope")
        if version < 4:  # written before logits were kept: none
            header.pop("logits_size", None)
            header.pop("logits_sha256", None)
            return header
        n_logits = header.get("logits_size")
        if not _is_int(n_logits) or n_logits < 0 or n_logits % 4:
            raise ValueError("bad logits size")
        if not isinstance(header.get("logits_sha256"), str):
            raise ValueError("bad logits checksum field")
        return header

    def _load_disk_index(self) -> None:
        """Offer the disk checkpoints a previous run left for this identity; remove every
        file that fails (a cache: nothing depends on it), so it cannot fail again."""
        assert self._disk is not None
        if not self._disk.is_dir():
            return
        try:
            paths = sorted(self._disk.glob("*.ckpt"))
            stale = list(self._disk.glob("*.tmp"))
        except OSError as exc:
            log.warning("cannot list the checkpoint folder %s: %s", self._disk, exc)
            return
        for path in paths:
            checkpoint = self._read_file(path, with_blob=False)
            if checkpoint is None:
                _remove(path)
                self.rejected += 1
                continue
            # After a restart the tree's node ids are not this run's: it stays unattached.
            try:
                file_bytes = path.stat().st_size
            except OSError:
                file_bytes = checkpoint.footprint
            self._entries[checkpoint.id] = _Entry(checkpoint, 0.0, path=path, in_ram=False,
                                                  file_bytes=file_bytes)
        for path in stale:
            _remove(path)


class _Yielded(Exception):
    """A spill given up for a request that waits (CheckpointStore.enforce_budget)."""


def _pieces(data: memoryview, waits: Callable[[], bool]) -> Iterator[memoryview]:
    """`data` SPILL_PIECE bytes at a time; raises _Yielded before a piece once `waits()`."""
    for start in range(0, len(data), SPILL_PIECE):
        if waits():
            raise _Yielded
        yield data[start:start + SPILL_PIECE]


def file_head(key: bytes, header: bytes, version: int = _FILE_VERSION) -> bytes:
    """What precedes a disk file's JSON header: magic, version, the header's length, and the
    tag, an HMAC-SHA256 with `key` over those and the header."""
    prefix = _PREFIX.pack(_FILE_MAGIC, version, len(header))
    return prefix + hmac.new(key, prefix + header, hashlib.sha256).digest()


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:  # a folder named like a checkpoint, say: never fatal
        log.warning("cannot remove %s: %s", path, exc)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def valid_bounds(bounds: object, n_tokens: int) -> TypeGuard[list[int] | tuple[int, ...]]:
    """Chunk ends as a file may carry them: ascending positive ints ending at n_tokens."""
    if not isinstance(bounds, list | tuple) or not bounds:
        return False
    if not all(map(_is_int, bounds)):
        return False
    return bounds[0] > 0 and bounds[-1] == n_tokens and all(
        a < b for a, b in itertools.pairwise(bounds)
    )
