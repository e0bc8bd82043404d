"""Import and export between files and the store: picks the format, validates everything
first, and changes the store in one transaction or not at all."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from engine.atomic import write_atomic
from engine.checkpoints import CheckpointStore, Identity
from engine.formats import FormatError
from engine.formats.chatgpt import export_chatgpt, parse_chatgpt
from engine.formats.markdown import export_markdown
from engine.formats.native import SessionContents, read_session, write_session
from engine.formats.openai_messages import export_openai_messages, parse_openai_messages
from engine.records import ConversationRecord
from engine.store import Store

log = logging.getLogger(__name__)

MAX_JSON_IMPORT = 512 << 20


class FileFormat(StrEnum):
    NATIVE = "arbor"  # the whole tree (and optionally checkpoints)
    CHATGPT = "chatgpt"  # conversations.json: the whole tree
    MARKDOWN = "markdown"  # the active branch
    OPENAI = "openai"  # the active branch as chat messages


def format_for_export(path: Path, requested: str | None = None) -> FileFormat:
    if requested:
        return FileFormat(requested)
    suffix = path.suffix.lower()
    if suffix == ".md":
        return FileFormat.MARKDOWN
    if suffix == ".json":
        return FileFormat.CHATGPT
    return FileFormat.NATIVE


@dataclass(frozen=True)
class ImportResult:
    conversation_ids: list[int]
    titles: list[str]
    checkpoints_kept: int
    checkpoints_dropped: int


def read_any(path: Path, *, identity: Identity | None = None) -> SessionContents:
    """Read a session file, a ChatGPT export or OpenAI messages, by content."""
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise FormatError(f"cannot read {path.name}: {exc.strerror}") from exc
    if head.startswith(b"PK"):
        return read_session(path, identity=identity)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_IMPORT:
            raise FormatError(f"{path.name} is {size} bytes (the limit is {MAX_JSON_IMPORT})")
        data = path.read_bytes()
    except OSError as exc:
        raise FormatError(f"cannot read {path.name}: {exc.strerror}") from exc
    stripped = data.lstrip()
    if stripped.startswith(b"["):
        return SessionContents(parse_chatgpt(data, max_bytes=MAX_JSON_IMPORT))
    if stripped.startswith(b"{"):
        return SessionContents([parse_openai_messages(data)])
    raise FormatError(
        f"{path.name} is not a session file, a ChatGPT export or OpenAI chat messages"
    )


def import_file(
    path: Path,
    store: Store,
    *,
    identity: Identity | None = None,
    checkpoints: CheckpointStore | None = None,
) -> ImportResult:
    """Validate the whole file, then add its conversations in one transaction."""
    contents = read_any(path, identity=identity)
    ids = store.import_records(contents.conversations)
    kept = 0
    if checkpoints is not None:
        for item in contents.checkpoints:
            checkpoints.add(item.checkpoint)  # keyed by tokens: found for that conversation
            kept += 1
        checkpoints.enforce_budget()
    dropped = contents.dropped_checkpoints + (len(contents.checkpoints) - kept)
    return ImportResult(ids, [r.title for r in contents.conversations], kept, dropped)


def export_file(
    store: Store, conversation_ids: list[int], out: Path, fmt: FileFormat
) -> None:
    """Write conversations to a file atomically."""
    records = [store.record(cid) for cid in conversation_ids]
    if fmt is FileFormat.NATIVE:
        write_session(out, records)
        return
    if fmt is FileFormat.CHATGPT:
        data = export_chatgpt(records)
    elif len(records) != 1:
        raise FormatError(f"{fmt.value} export takes one conversation")
    elif fmt is FileFormat.MARKDOWN:
        data = export_markdown(records[0]).encode("utf-8")
    else:
        data = export_openai_messages(records[0])
    write_atomic(out, data)


__all__ = ["ConversationRecord", "FileFormat", "ImportResult", "export_file", "import_file"]
