"""Arbor's own session file (`.arbor`): whole trees, and optionally their checkpoints.

A zip archive:
    manifest.json              format, version, app version, sha256 of every other member
    conversations/<i>.json     one conversation: every node of every branch, the active leaf,
                               per-node tokens, settings, model identity
    checkpoints/<k>.json       a checkpoint's header: conversation, tokens, identity, size,
                               sha256, and an HMAC tag made with this installation's key
    checkpoints/<k>.bin        the state blob (stored, not compressed)

Writing is atomic (temp file in the same folder, fsync, os.replace). Reading validates
everything before anything is returned: sizes and member counts, compression ratios (no zip
bombs), names (nothing outside the known layout), checksums, strict JSON, and the tree shape.
Checkpoints are returned only when their identity matches the loaded model and their tag was
made with this installation's key: llama.cpp's state loader is not safe on foreign bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from engine import __version__
from engine.atomic import atomic_writer, create_once, write_atomic
from engine.checkpoints import Checkpoint, Identity, valid_bounds
from engine.formats import FormatError
from engine.formats.strict_json import dumps_strict, loads_strict
from engine.paths import data_dirs
from engine.records import ConversationRecord, NodeRecord, RecordError, validate
from engine.tree import NodeStatus, Role

FORMAT = "arbor-session"
VERSION = 1
MAX_FILE_BYTES = 8 << 30
MAX_MEMBERS = 10_000
MAX_JSON_BYTES = 256 << 20
MAX_BLOB_BYTES = 4 << 30
MAX_TOTAL_BYTES = 16 << 30
MAX_RATIO = 200  # uncompressed / compressed, for deflated members
KEY_FILE = "session-key"
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


# --- the installation key ----------------------------------------------------------------------


def installation_key(config_dir: Path | None = None) -> bytes:
    """This installation's secret for checkpoint tags, created on first use (mode 0600)."""
    path = (config_dir or data_dirs().config) / KEY_FILE
    for _ in range(2):
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            key = secrets.token_bytes(32)
            if create_once(path, key):
                return key
            continue  # another process made it first: use theirs
        if len(key) == 32:
            return key
        # Damaged (it was once written in place): a new key, atomically. Checkpoints signed
        # with the old one were unverifiable anyway.
        key = secrets.token_bytes(32)
        write_atomic(path, key, mode=0o600)
        return key
    raise OSError(f"cannot read or create {path}")


def _tag(key: bytes, header: dict[str, Any], blob: bytes | bytearray) -> str:
    mac = hmac.new(key, dumps_strict(header), hashlib.sha256)
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
        size = path.stat().st_size
    except OSError as exc:
        raise FormatError(f"cannot read {path.name}: {exc.strerror}") from exc
    if size > MAX_FILE_BYTES:
        raise FormatError(f"{path.name} is {size} bytes; session files are limited to "
                          f"{MAX_FILE_BYTES}")
    try:
        with zipfile.ZipFile(path) as archive:
            return _read_archive(archive, identity, key)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error) as exc:
        raise FormatError(f"{path.name} is not an Arbor session file (not a valid zip: "
                          f"{exc})") from exc
    except (OSError, NotImplementedError, RuntimeError, ValueError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{path.name} cannot be read as a session file: {exc}") from exc


def _read_archive(
    archive: zipfile.ZipFile, identity: Identity | None, key: bytes | None
) -> SessionContents:
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise FormatError(f"the file has {len(infos)} members (the limit is {MAX_MEMBERS})")
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise FormatError("the file lists a member twice")
    total = 0
    for info in infos:
        if not _NAME.fullmatch(info.filename):
            raise FormatError(f"unexpected member {info.filename[:80]!r} in the file")
        limit = MAX_BLOB_BYTES if info.filename.endswith(".bin") else MAX_JSON_BYTES
        if info.file_size > limit:
            raise FormatError(f"member {info.filename} is {info.file_size} bytes (too large)")
        if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_RATIO * max(
            info.compress_size, 1
        ):
            raise FormatError(f"member {info.filename} expands {info.file_size} times its size "
                              f"(a zip bomb?)")
        total += info.file_size
    if total > MAX_TOTAL_BYTES:
        raise FormatError(f"the file expands to {total} bytes (too large)")
    if "manifest.json" not in names:
        raise FormatError("the file has no manifest: it is not an Arbor session file")

    manifest = _json(archive, "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError("the manifest does not describe an Arbor session file")
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > VERSION:
        raise FormatError(f"session file version {version!r} is newer than this Arbor reads")
    listed = manifest.get("members")
    if not isinstance(listed, dict) or set(listed) != set(names) - {"manifest.json"}:
        raise FormatError("the manifest does not list exactly the file's members")
    data = {name: _member(archive, name, listed[name]) for name in listed}

    conversations: list[ConversationRecord] = []
    index = 0
    while f"conversations/{index}.json" in data:
        raw = _parse_json(f"conversations/{index}.json", data[f"conversations/{index}.json"])
        conversations.append(_record_from_json(raw, index))
        index += 1
    if not conversations or index != sum(n.startswith("conversations/") for n in data):
        raise FormatError("the file's conversations are missing or not numbered 0, 1, 2…")

    checkpoints: list[SessionCheckpoint] = []
    dropped = 0
    k = 0
    while f"checkpoints/{k}.json" in data or f"checkpoints/{k}.bin" in data:
        item = _checkpoint(data, k, len(conversations), identity, key)
        if item is None:
            dropped += 1
        else:
            checkpoints.append(item)
        k += 1
    if 2 * k != sum(n.startswith("checkpoints/") for n in data):
        raise FormatError("the file's checkpoints are not numbered 0, 1, 2…")
    return SessionContents(conversations, checkpoints, dropped, str(manifest.get("app_version")))


def _member(archive: zipfile.ZipFile, name: str, digest: object) -> bytes:
    info = archive.getinfo(name)
    with archive.open(info) as f:
        data = f.read(info.file_size + 1)  # never more than declared, whatever the stream says
    if len(data) != info.file_size:
        raise FormatError(f"member {name} is not the size the file declares")
    if not isinstance(digest, str) or hashlib.sha256(data).hexdigest() != digest:
        raise FormatError(f"member {name} is damaged (its checksum does not match)")
    return data


def _json(archive: zipfile.ZipFile, name: str) -> Any:
    info = archive.getinfo(name)
    with archive.open(info) as f:
        data = f.read(min(info.file_size, MAX_JSON_BYTES) + 1)
    return _parse_json(name, data)


def _parse_json(name: str, data: bytes) -> Any:
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
    data: dict[str, bytes], k: int, n_conversations: int, identity: Identity | None,
    key: bytes | None,
) -> SessionCheckpoint | None:
    """A checkpoint if it can be trusted here, None to drop it. Malformed is an error."""
    header_name, blob_name = f"checkpoints/{k}.json", f"checkpoints/{k}.bin"
    if header_name not in data or blob_name not in data:
        raise FormatError(f"checkpoint {k} is incomplete")
    header = _obj(_parse_json(header_name, data[header_name]), header_name)
    blob = data[blob_name]
    try:
        tag = str(header.pop("tag"))
        found = Identity(**_obj(header["identity"], f"{header_name}: identity"))
        tokens = tuple(int(t) for t in header["tokens"])
        conversation = int(header["conversation"])
        flags = int(header["flags"])
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{header_name} is malformed ({exc})") from None
    if not 0 <= conversation < n_conversations or not tokens:
        raise FormatError(f"{header_name} refers to no conversation of the file")
    if header.get("size") != len(blob) or header.get("sha256") != hashlib.sha256(blob).hexdigest():
        raise FormatError(f"{blob_name} is damaged")
    if identity is None or found != identity:
        return None  # made for another model or context: the engine will reprocess
    bounds = header.get("bounds")
    if not valid_bounds(bounds, len(tokens)):
        return None  # older files: decoded with an unrecorded schedule, never exact here
    secret = key if key is not None else installation_key()
    if not hmac.compare_digest(tag, _tag(secret, header, blob)):
        return None  # not made by this installation: never hand it to llama.cpp
    return SessionCheckpoint(
        conversation=conversation,
        checkpoint=Checkpoint(
            tokens=tokens, blob=bytearray(blob), bounds=tuple(bounds), flags=flags
        ),
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
