"""Checkpoints: saved per-sequence engine state after a known prefix of tokens.

A checkpoint holds the exact tokens its state covers and the chunk ends they were decoded with,
so it is valid for a target exactly when those tokens are a prefix of the target and those ends
are the target's decode schedule up to there (`engine.schedule`); the first is the same as "on
the target's path in the tree", since a path's tokens are its nodes' tokens. It is attached to
the tree node that holds its last token, so deleting the node frees it.

The store keeps checkpoints in RAM under a budget and spills the least valuable ones to a disk
tier before dropping anything. Every blob carries the identity of the context that made it; a
disk file also carries a checksum. A blob whose identity or checksum does not match is never
handed to llama.cpp: its state loader is not safe on foreign bytes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

from engine.atomic import atomic_writer
from engine.model import MemoryKind
from engine.schedule import Schedule, crossing

log = logging.getLogger(__name__)

_ids = itertools.count(1)
DEFAULT_INTERVAL = 2048
_FILE_MAGIC = b"ARBORCKP"
_FILE_VERSION = 2  # 2: the chunk ends ("bounds"); version 1 files are discarded
_HEADER_LIMIT = 1 << 26


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

    def __post_init__(self) -> None:
        if self.size < 0:
            object.__setattr__(self, "size", len(self.blob or b""))

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def pos_max(self) -> int:
        return len(self.tokens) - 1

    def is_prefix_of(self, target: Sequence[int]) -> bool:
        n = len(self.tokens)
        return n <= len(target) and tuple(target[:n]) == self.tokens

    def fits(self, target: Sequence[int], schedule: Schedule) -> bool:
        """Whether restoring this and decoding the rest of `target` by `schedule` gives
        exactly the state a full decode by `schedule` gives: a prefix decoded with the
        schedule's own chunk ends, leaving at least the last chunk to decode."""
        return (
            self.n_tokens < len(target)
            and schedule.agrees(self.bounds)
            and self.is_prefix_of(target)
        )


# --- placement -----------------------------------------------------------------------------


RECURRENT_INTERVAL = 256


def plan_saves(
    kind: MemoryKind, schedule: Schedule, node_ends: Sequence[int], interval: int
) -> list[int]:
    """Where to capture state while decoding a target by `schedule`: always chunk ends.

    - The end of the prompt, always: a reply's tokens come from one-token decodes that a
      batched decode would not reproduce, so the last exact state before a reply is the
      prompt's end. The next message restores it and decodes the reply with itself.
    - Node ends (where edits diverge), for kinds whose cache cannot be cut back there:
      recurrent, hybrid and sliding-window models. A dense cache is cut back to any
      node end of the live branch for free, so it only needs the prompt-end states to jump
      to a branch that is not live.
    - Inside long stretches, the first chunk end at or past each multiple of `interval`. A
      recurrent state is the same size wherever it is taken (a few MiB, against a KV cache
      that grows with every token), so there the interval is at most RECURRENT_INTERVAL:
      an edit near the end of a long message then re-reads a few hundred tokens, not all.
    The answer depends on the schedule alone, never on what the store already holds.
    """
    if kind is MemoryKind.RECURRENT and interval > 0:
        interval = min(interval, RECURRENT_INTERVAL)
    ends = set(schedule.ends)
    saves = {schedule.length}
    if kind is not MemoryKind.DENSE:
        saves.update(n for n in node_ends if n in ends)
    saves.update(crossing(schedule, 0, interval))
    return sorted(saves)


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


class CheckpointStore:
    """The checkpoints of one context identity: a RAM tier, an optional disk tier."""

    def __init__(
        self,
        identity: Identity,
        *,
        ram_budget: int | None = None,
        disk_dir: Path | None = None,
        disk_budget: int = 8 << 30,
    ) -> None:
        self.identity = identity
        self.ram_budget = default_ram_budget() if ram_budget is None else ram_budget
        self.disk_budget = disk_budget
        self._disk = disk_dir / identity.key() if disk_dir is not None else None
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

    def candidates(self, target: Sequence[int], schedule: Schedule) -> list[Checkpoint]:
        """Every checkpoint that fits `target` decoded by `schedule`, deepest first."""
        found = [e.checkpoint for e in self._entries.values()
                 if e.checkpoint.fits(target, schedule)]
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

    def stats(self) -> StoreStats:
        ram = [e for e in self._entries.values() if e.in_ram]
        disk = [e for e in self._entries.values() if e.path is not None]
        return StoreStats(
            count=len(self._entries),
            ram_count=len(ram),
            disk_count=len(disk),
            ram_bytes=sum(e.checkpoint.size for e in ram),
            disk_bytes=sum(e.path.stat().st_size for e in disk if e.path and e.path.exists()),
            ram_budget=self.ram_budget,
            disk_budget=self.disk_budget if self._disk is not None else 0,
            created=self.created,
            restored=self.restored,
            rejected=self.rejected,
        )

    # --- changes ---------------------------------------------------------------------

    def add(self, checkpoint: Checkpoint) -> None:
        """Keep a new checkpoint in RAM. The budget is enforced later, by `enforce_budget`,
        so that creation costs no more than the copy already made."""
        if not valid_bounds(checkpoint.bounds, checkpoint.n_tokens):
            raise ValueError("a checkpoint without its chunk ends can never be restored")
        for entry in self._entries.values():
            held = entry.checkpoint
            if held.tokens == checkpoint.tokens and held.bounds == checkpoint.bounds:
                entry.last_used = time.monotonic()
                return  # the same state is already kept
        self._entries[checkpoint.id] = _Entry(checkpoint, time.monotonic())
        self.created += 1

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
        if loaded is None or (loaded.tokens, loaded.bounds) != (
            checkpoint.tokens, checkpoint.bounds
        ):
            self.reject(checkpoint.id)
            return None
        return replace(checkpoint, blob=loaded.blob)

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
            entry.path.unlink(missing_ok=True)

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

    def enforce_budget(self) -> None:
        """Move the least valuable checkpoints out of RAM: to disk if there is a disk tier,
        else away. Value: on the active branch, then recently used, then costly to redo."""
        ram = [e for e in self._entries.values() if e.in_ram]
        used = sum(e.checkpoint.size for e in ram)
        if used <= self.ram_budget:
            return
        ram.sort(key=self._value)
        for entry in ram:
            if used <= self.ram_budget:
                break
            used -= entry.checkpoint.size
            self._evict(entry)
        self._enforce_disk_budget()

    def configure(self, *, ram_budget: int | None, disk_dir: Path | None) -> None:
        """New settings, applied at once. Turning the disk tier off removes its files (they
        are a cache: the conversations never depend on them); turning it on offers what a
        previous run left there."""
        self.ram_budget = default_ram_budget() if ram_budget is None else ram_budget
        wanted = disk_dir / self.identity.key() if disk_dir is not None else None
        if wanted != self._disk:
            for checkpoint_id, entry in list(self._entries.items()):
                if entry.path is None:
                    continue
                entry.path.unlink(missing_ok=True)
                entry.path = None
                if not entry.in_ram:
                    del self._entries[checkpoint_id]
            self._disk = wanted
            if self._disk is not None:
                self._load_disk_index()
        self.enforce_budget()

    # --- internals -------------------------------------------------------------------

    def _value(self, entry: _Entry) -> tuple[bool, float, int]:
        return (entry.checkpoint.node_id in self._protected, entry.last_used,
                entry.checkpoint.n_tokens)

    def _evict(self, entry: _Entry) -> None:
        checkpoint = entry.checkpoint
        if self._disk is not None and entry.path is None:
            try:
                entry.path = self._write_file(checkpoint)
            except OSError as exc:
                log.warning("cannot write checkpoint %d to disk (%s)", checkpoint.id, exc)
        if entry.path is None:
            del self._entries[checkpoint.id]
            return
        entry.in_ram = False
        entry.checkpoint = replace(checkpoint, blob=None)

    def _enforce_disk_budget(self) -> None:
        on_disk = [e for e in self._entries.values() if e.path is not None and not e.in_ram]
        used = sum(e.checkpoint.size for e in on_disk)
        on_disk.sort(key=self._value)
        for entry in on_disk:
            if used <= self.disk_budget:
                break
            used -= entry.checkpoint.size
            self.drop(entry.checkpoint.id)

    def _write_file(self, checkpoint: Checkpoint) -> Path:
        """One file per checkpoint: magic, version, header length, JSON header, blob.
        Written to a temp file, fsynced, then renamed into place."""
        assert self._disk is not None and checkpoint.blob is not None
        self._disk.mkdir(parents=True, exist_ok=True)
        header = json.dumps({
            "identity": asdict(self.identity),
            "tokens": list(checkpoint.tokens),
            "bounds": list(checkpoint.bounds),
            "flags": checkpoint.flags,
            "node_id": checkpoint.node_id,
            "size": checkpoint.size,
            "sha256": hashlib.sha256(checkpoint.blob).hexdigest(),
        }).encode()
        final = self._disk / f"{checkpoint.id}-{int(time.time() * 1e6)}.ckpt"
        with atomic_writer(final) as f:
            f.write(_FILE_MAGIC + struct.pack("<II", _FILE_VERSION, len(header)))
            f.write(header)
            f.write(checkpoint.blob)
        return final

    def _read_header(self, f: BinaryIO) -> dict[str, Any]:
        head = f.read(len(_FILE_MAGIC) + 8)
        if len(head) != len(_FILE_MAGIC) + 8 or not head.startswith(_FILE_MAGIC):
            raise ValueError("not an Arbor checkpoint file")
        version, header_len = struct.unpack("<II", head[len(_FILE_MAGIC):])
        if version != _FILE_VERSION or header_len > _HEADER_LIMIT:
            raise ValueError(f"unsupported checkpoint file (version {version})")
        header = json.loads(f.read(header_len))
        if not isinstance(header, dict):
            raise ValueError("bad header")
        if header.get("identity") != asdict(self.identity):
            raise ValueError("made by another model or context configuration")
        tokens = header["tokens"]
        if not tokens or not all(isinstance(t, int) for t in tokens):
            raise ValueError("bad token list")
        if not valid_bounds(header.get("bounds"), len(tokens)):
            raise ValueError("bad chunk ends")
        if not isinstance(header["size"], int) or not isinstance(header["sha256"], str):
            raise ValueError("bad size or checksum field")
        return header

    def _read_file(self, path: Path, *, with_blob: bool = True) -> Checkpoint | None:
        """Read and verify a disk checkpoint; None (and a log line) if anything is off.
        Without the blob only the header is checked (for the index at start-up); the
        checksum is always verified before a blob is handed out."""
        try:
            with path.open("rb") as f:
                header = self._read_header(f)
                size = header["size"]
                blob = f.read(size + 1) if with_blob else None
            if blob is not None:
                if len(blob) != size:
                    raise ValueError(f"blob is {len(blob)} bytes, expected {size}")
                if hashlib.sha256(blob).hexdigest() != header["sha256"]:
                    raise ValueError("checksum mismatch")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("discarding checkpoint file %s: %s", path.name, exc)
            return None
        node = header.get("node_id")
        return Checkpoint(
            tokens=tuple(header["tokens"]), blob=blob, bounds=tuple(header["bounds"]),
            flags=int(header["flags"]),
            node_id=node if isinstance(node, int) else None, size=size,
        )

    def _load_disk_index(self) -> None:
        """Offer the disk checkpoints a previous run left for this identity."""
        assert self._disk is not None
        if not self._disk.is_dir():
            return
        for path in sorted(self._disk.glob("*.ckpt")):
            checkpoint = self._read_file(path, with_blob=False)
            if checkpoint is None:
                path.unlink(missing_ok=True)
                self.rejected += 1
                continue
            # After a restart the tree's node ids are not this run's: keep it unattached.
            light = replace(checkpoint, node_id=None)
            self._entries[light.id] = _Entry(light, 0.0, path=path, in_ram=False)
        for stale in self._disk.glob("*.tmp"):
            stale.unlink(missing_ok=True)


def valid_bounds(bounds: object, n_tokens: int) -> TypeGuard[list[int] | tuple[int, ...]]:
    """Chunk ends as a file may carry them: ascending positive ints ending at n_tokens."""
    if not isinstance(bounds, list | tuple) or not bounds:
        return False
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds):
        return False
    return bounds[0] > 0 and bounds[-1] == n_tokens and all(
        a < b for a, b in itertools.pairwise(bounds)
    )
