"""Arbor's own session file (`.arbor`): whole trees, and optionally their checkpoints.

A zip archive:
    manifest.json              format, version, app version, sha256 of every other member
    conversations/<i>.json     one conversation: every node of every branch, the active leaf,
                               per-node tokens, settings, model identity
    checkpoints/<k>.json       a checkpoint's header: conversation, tokens, identity, size,
                               sha256, and an HMAC tag made with this installation's key
    checkpoints/<k>.bin        the state blob (stored, not compressed)

Writing is atomic (temp file in the same folder, fsync, os.replace). Reading validates
everything before anything is returned: sizes and member counts, compression (stored or
deflated only), names (nothing outside the known layout), checksums, strict JSON, and the tree
shape. Members are inflated here as their bytes are read, never trusting the sizes the zip
directory declares: a member stops at its declared size and at MAX_RATIO times the compressed
bytes actually read (no zip bombs). Members are read one at a time: besides what it returns
(the records and the blobs of usable checkpoints), reading holds one JSON member and its
parse, or one 64 KiB chunk of a blob.
Checkpoints are returned only when their identity matches the loaded model and their tag was
made with this installation's key: llama.cpp's state loader is not safe on foreign bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import struct
import time
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

from engine import __version__
from engine.core.records import ConversationRecord, NodeRecord, RecordError, validate
from engine.core.tree import NodeStatus, Role
from engine.files.atomic import atomic_writer
from engine.files.regular import FormatError, open_regular
from engine.files.strict_json import dumps_strict, loads_strict
from engine.storage.checkpoints import PARTIAL_ONLY, Checkpoint, Identity, valid_bounds
from engine.storage.keyfile import installation_key

FORMAT = "arbor-session"
VERSION = 1
MAX_FILE_BYTES = 8 << 30
MAX_MEMBERS = 10_000
MAX_JSON_BYTES = 256 << 20
MAX_BLOB_BYTES = 4 << 30
MAX_TOTAL_BYTES = 16 << 30
MAX_RATIO = 200  # uncompressed / compressed bytes actually read, for deflated members
_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
_CHUNK = 1 << 16
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, (versions to sizes), name/extra lengths
_TAG = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"manifest\.json|conversations/\d{1,6}\.json|checkpoints/\d{1,6}\.(json|bin)")


@dataclass(frozen=True)
class SessionCheckpoint:
    """A checkpoint travelling with a conversation in a session file."""

    conversation: int  # index into the file's conversations
    checkpoint: Checkpoint
    identity: Identity


@dataclass(frozen=True)
class SessionContents:
    conversations: list[ConversationRecord]
    checkpoints: list[SessionCheckpoint] = field(default_factory=list)
    dropped_checkpoints: int = 0  # present in the file but not usable here
    app_version: str = ""


def _mac(key: bytes, header: dict[str, Any]) -> hmac.HMAC:
    """The tag's HMAC over the header (without its tag); the blob is added to it."""
    return hmac.new(key, dumps_strict(header), hashlib.sha256)


def _tag(key: bytes, header: dict[str, Any], blob: bytes | bytearray) -> str:
    mac = _mac(key, header)
    mac.update(blob)
    return mac.hexdigest()


# --- writing -----------------------------------------------------------------------------------


def write_session(
    path: Path,
    conversations: Sequence[ConversationRecord],
    checkpoints: Sequence[SessionCheckpoint] = (),
    *,
    key: bytes | None = None,
) -> None:
    """Write a session file atomically: a crash leaves the old file or the new one."""
    members: dict[str, bytes | bytearray] = {}
    for index, record in enumerate(conversations):
        members[f"conversations/{index}.json"] = dumps_strict(_record_to_json(record))
    if checkpoints:
        secret = key if key is not None else installation_key()
        for index, item in enumerate(checkpoints):
            blob = item.checkpoint.blob
            if blob is None:
                continue
            header = {
                "conversation": item.conversation,
                "tokens": list(item.checkpoint.tokens),
                "bounds": list(item.checkpoint.bounds),
                "flags": item.checkpoint.flags,
                "identity": asdict(item.identity),
                "size": len(blob),
                "sha256": hashlib.sha256(blob).hexdigest(),
            }
            members[f"checkpoints/{index}.json"] = dumps_strict(
                {**header, "tag": _tag(secret, header, blob)}
            )
            members[f"checkpoints/{index}.bin"] = blob
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "app_version": __version__,
        "created": time.time(),
        "members": {name: hashlib.sha256(data).hexdigest() for name, data in members.items()},
    }
    with atomic_writer(path) as raw, zipfile.ZipFile(raw, "w") as archive:
        archive.writestr("manifest.json", dumps_strict(manifest), zipfile.ZIP_DEFLATED)
        for name, data in members.items():
            method = zipfile.ZIP_STORED if name.endswith(".bin") else zipfile.ZIP_DEFLATED
            archive.writestr(name, bytes(data), method)


def _record_to_json(record: ConversationRecord) -> dict[str, Any]:
    return {
        "title": record.title,
        "created": record.created,
        "updated": record.updated,
        "settings": record.settings,
        "model": record.model,
        "active_leaf": record.active_leaf,
        "nodes": [
            {
                "id": n.id,
                "parent": n.parent,
                "role": n.role.value,
                "text": n.text,
                "created": n.created,
                "tokens": list(n.tokens) if n.tokens is not None else None,
                "status": n.status.value,
                "meta": n.meta,
                "last_active_child": n.last_active_child,
            }
            for n in record.nodes
        ],
    }


# --- reading -----------------------------------------------------------------------------------


def read_session(
    path: Path, *, identity: Identity | None = None, key: bytes | None = None
) -> SessionContents:
    """Read and validate a session file. Raises FormatError naming the first problem."""
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise FormatError(f"{path.name} is {size} bytes; session files are limited to "
                                  f"{MAX_FILE_BYTES}")
            with zipfile.ZipFile(f) as archive:
                infos = archive.infolist()
            return _read_archive(f, infos, identity, key)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise FormatError(f"{path.name} is not an Arbor session file (not a valid zip: "
                          f"{exc})") from exc
    except OSError as exc:
        raise FormatError(f"cannot read {path.name}: {exc.strerror or exc}") from exc
    except (NotImplementedError, RuntimeError, ValueError) as exc:
        raise FormatError(f"{path.name} cannot be read as a session file: {exc}") from exc


def _read_archive(
    f: BinaryIO, infos: list[zipfile.ZipInfo], identity: Identity | None, key: bytes | None
) -> SessionContents:
    _check_directory(infos)
    by_name = {info.filename: info for info in infos}
    manifest = _parse_json("manifest.json", _read(f, by_name["manifest.json"])[0])
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError("the manifest does not describe an Arbor session file")
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > VERSION:
        raise FormatError(f"session file version {version!r} is newer than this Arbor reads")
    listed = manifest.get("members")
    if not isinstance(listed, dict) or set(listed) != set(by_name) - {"manifest.json"}:
        raise FormatError("the manifest does not list exactly the file's members")
    members = _Members(f, by_name, listed)

    conversations: list[ConversationRecord] = []
    index = 0
    while (name := f"conversations/{index}.json") in listed:
        conversations.append(_record_from_json(_parse_json(name, members.read(name)), index))
        index += 1
    if not conversations or index != sum(n.startswith("conversations/") for n in listed):
        raise FormatError("the file's conversations are missing or not numbered 0, 1, 2…")

    checkpoints: list[SessionCheckpoint] = []
    dropped = 0
    k = 0
    while f"checkpoints/{k}.json" in listed or f"checkpoints/{k}.bin" in listed:
        item = _checkpoint(members, k, len(conversations), identity, key)
        if item is None:
            dropped += 1
        else:
            checkpoints.append(item)
        k += 1
    if 2 * k != sum(n.startswith("checkpoints/") for n in listed):
        raise FormatError("the file's checkpoints are not numbered 0, 1, 2…")
    return SessionContents(conversations, checkpoints, dropped, str(manifest.get("app_version")))


def _check_directory(infos: list[zipfile.ZipInfo]) -> None:
    """What the zip directory declares, checked before any member is read (the sizes are
    checked again against the bytes as they are read)."""
    if len(infos) > MAX_MEMBERS:
        raise FormatError(f"the file has {len(infos)} members (the limit is {MAX_MEMBERS})")
    names = {info.filename for info in infos}
    if len(names) != len(infos):
        raise FormatError("the file lists a member twice")
    total = 0
    for info in infos:
        if not _NAME.fullmatch(info.filename):
            raise FormatError(f"unexpected member {info.filename[:80]!r} in the file")
        if info.compress_type not in _METHODS:
            raise FormatError(f"member {info.filename} is compressed with method "
                              f"{info.compress_type}; only stored and deflated members are read")
        if info.flag_bits & 0x1:
            raise FormatError(f"member {info.filename} is encrypted")
        limit = MAX_BLOB_BYTES if info.filename.endswith(".bin") else MAX_JSON_BYTES
        if info.file_size > limit:
            raise FormatError(f"member {info.filename} is {info.file_size} bytes (too large)")
        total += info.file_size
    if total > MAX_TOTAL_BYTES:
        raise FormatError(f"the file expands to {total} bytes (too large)")
    if "manifest.json" not in names:
        raise FormatError("the file has no manifest: it is not an Arbor session file")


@dataclass(frozen=True)
class _Members:
    """The members of an open session file, each checked against the manifest's sha256."""

    f: BinaryIO
    infos: dict[str, zipfile.ZipInfo]
    digests: dict[str, Any]

    def read(self, name: str, mac: hmac.HMAC | None = None, *, keep: bool = True) -> bytearray:
        """The member's bytes (empty unless `keep`), streamed through `mac` if given."""
        data, digest = _read(self.f, self.infos[name], mac, keep=keep)
        if digest != self.digests[name]:
            raise FormatError(f"member {name} is damaged (its checksum does not match)")
        return data

    def size(self, name: str) -> int:
        return self.infos[name].file_size  # the bytes read, once `read` returned


def _read(
    f: BinaryIO, info: zipfile.ZipInfo, mac: hmac.HMAC | None = None, *, keep: bool = True
) -> tuple[bytearray, str]:
    """A member streamed through sha256 (and `mac`): its bytes if `keep`, and the digest."""
    digest = hashlib.sha256()
    data = bytearray()
    for chunk in _inflate(f, info):
        digest.update(chunk)
        if mac is not None:
            mac.update(chunk)
        if keep:
            data += chunk
    return data, digest.hexdigest()


def _inflate(f: BinaryIO, info: zipfile.ZipInfo) -> Iterator[bytes]:
    """A member's bytes, chunk by chunk, as its compressed bytes are read from the file.

    Whatever the directory says, the output stops at the declared size and at MAX_RATIO
    times the compressed bytes read so far; it must then match the declared size and CRC."""
    name = info.filename
    f.seek(info.header_offset)
    head = f.read(_LOCAL_HEADER.size)
    if len(head) != _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
        raise FormatError(f"member {name} is damaged (no local header)")
    f.seek(sum(_LOCAL_HEADER.unpack(head)[1:]), os.SEEK_CUR)  # past its name and extra field
    deflated = info.compress_type == zipfile.ZIP_DEFLATED
    inflater = zlib.decompressobj(-zlib.MAX_WBITS) if deflated else None
    left, read, produced, crc = info.compress_size, 0, 0, 0
    pending = b""
    while inflater is None or not inflater.eof:
        if not pending:
            pending = f.read(min(_CHUNK, left))
            if not pending:
                break
            left -= len(pending)
            read += len(pending)
        if inflater is None:
            out, pending = pending, b""
        else:
            try:
                out = inflater.decompress(pending, _CHUNK)
            except zlib.error as exc:
                raise FormatError(f"member {name} is damaged ({exc})") from None
            pending = inflater.unconsumed_tail
        produced += len(out)
        if produced > info.file_size:
            raise FormatError(f"member {name} is larger than the file declares")
        if produced > MAX_RATIO * read:
            raise FormatError(f"member {name} expands more than {MAX_RATIO} times the bytes "
                              f"read (a zip bomb?)")
        crc = zlib.crc32(out, crc)
        yield out
    if produced != info.file_size or crc != info.CRC:
        raise FormatError(f"member {name} is truncated or damaged")


def _parse_json(name: str, data: bytes | bytearray) -> Any:
    try:
        return loads_strict(data, max_bytes=MAX_JSON_BYTES, max_depth=32)
    except FormatError as exc:
        raise FormatError(f"{name}: {exc}") from exc


def _record_from_json(raw: Any, index: int) -> ConversationRecord:
    where = f"conversation {index}"
    obj = _obj(raw, where)
    nodes_raw = obj.get("nodes")
    if not isinstance(nodes_raw, list):
        raise FormatError(f"{where}: `nodes` must be a list")
    nodes = tuple(_node_from_json(n, f"{where}, message {i}") for i, n in enumerate(nodes_raw))
    record = ConversationRecord(
        title=_str(obj.get("title"), f"{where}: title"),
        nodes=nodes,
        active_leaf=_str(obj.get("active_leaf"), f"{where}: active_leaf"),
        created=_num(obj.get("created", 0.0), f"{where}: created"),
        updated=_num(obj.get("updated", 0.0), f"{where}: updated"),
        settings=_obj(obj.get("settings", {}), f"{where}: settings"),
        model=_obj(obj["model"], f"{where}: model") if obj.get("model") is not None else None,
    )
    try:
        validate(record)
    except RecordError as exc:
        raise FormatError(str(exc)) from exc
    return record


def _node_from_json(raw: Any, where: str) -> NodeRecord:
    obj = _obj(raw, where)
    try:
        role = Role(cast(str, obj.get("role")))
        status = NodeStatus(obj.get("status", "complete"))
    except ValueError:
        raise FormatError(f"{where}: unknown role or status") from None
    tokens = obj.get("tokens")
    if tokens is not None and not (
        isinstance(tokens, list)
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 31
                for t in tokens)
    ):
        raise FormatError(f"{where}: `tokens` must be a list of token ids")
    parent = obj.get("parent")
    last = obj.get("last_active_child")
    return NodeRecord(
        id=_str(obj.get("id"), f"{where}: id"),
        parent=_str(parent, f"{where}: parent") if parent is not None else None,
        role=role,
        text=_str(obj.get("text"), f"{where}: text"),
        created=_num(obj.get("created", 0.0), f"{where}: created"),
        tokens=tuple(tokens) if tokens is not None else None,
        status=status,
        meta=_obj(obj.get("meta", {}), f"{where}: meta"),
        last_active_child=_str(last, f"{where}: last_active_child") if last is not None else None,
    )


def _checkpoint(
    members: _Members, k: int, n_conversations: int, identity: Identity | None,
    key: bytes | None,
) -> SessionCheckpoint | None:
    """A checkpoint if it can be trusted here, None to drop it. Malformed is an error.

    The blob streams by; it is kept only when the checkpoint can be used here."""
    header_name, blob_name = f"checkpoints/{k}.json", f"checkpoints/{k}.bin"
    if header_name not in members.digests or blob_name not in members.digests:
        raise FormatError(f"checkpoint {k} is incomplete")
    header = _obj(_parse_json(header_name, members.read(header_name)), header_name)
    try:
        tag = header.pop("tag")
        found = Identity(**_obj(header["identity"], f"{header_name}: identity"))
        tokens = tuple(int(t) for t in header["tokens"])
        conversation = int(header["conversation"])
        flags = int(header["flags"])
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{header_name} is malformed ({exc})") from None
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise FormatError(f"{header_name}: the tag is not 64 hexadecimal digits")
    if not 0 <= conversation < n_conversations or not tokens:
        raise FormatError(f"{header_name} refers to no conversation of the file")
    bounds = header.get("bounds")
    # Another model or context: the engine will reprocess. No chunk ends: an older file,
    # decoded with an unrecorded schedule, never exact here.
    chunk_ends = tuple(bounds) if valid_bounds(bounds, len(tokens)) else None
    # A partial state needs the live cache of the context that made it: never written, and
    # never usable from a file.
    usable = (identity is not None and found == identity and chunk_ends is not None
              and not flags & PARTIAL_ONLY)
    mac = _mac(key if key is not None else installation_key(), header) if usable else None
    blob = members.read(blob_name, mac, keep=usable)
    wrong_size = header.get("size") != members.size(blob_name)
    if wrong_size or header.get("sha256") != members.digests[blob_name]:
        raise FormatError(f"{blob_name} is damaged")
    if mac is None or chunk_ends is None or not hmac.compare_digest(tag, mac.hexdigest()):
        return None  # not usable, or not made by this installation: never given to llama.cpp
    return SessionCheckpoint(
        conversation=conversation,
        checkpoint=Checkpoint(tokens=tokens, blob=blob, bounds=chunk_ends, flags=flags),
        identity=found,
    )


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FormatError(f"{where} must be an object")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise FormatError(f"{where} must be a string")
    return value


def _num(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FormatError(f"{where} must be a number")
    return float(value)
