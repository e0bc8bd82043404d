"""Import and export between files and the store: picks the format, validates everything
first, and changes the store in one transaction or not at all."""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from engine.core.errors import Cancelled
from engine.core.records import ConversationRecord, to_tree
from engine.core.tree import Tree
from engine.files.atomic import write_atomic
from engine.files.regular import FormatError, open_regular, read_regular
from engine.storage.checkpoints import CheckpointStore, Identity
from engine.storage.formats.arbor_file import (
    SessionCheckpoint,
    SessionContents,
    read_session,
    write_session,
)
from engine.storage.formats.chatgpt_export import export_chatgpt
from engine.storage.formats.chatgpt_import import parse_chatgpt
from engine.storage.formats.markdown import export_markdown
from engine.storage.formats.openai_messages import export_openai_messages, parse_openai_messages
from engine.storage.store import Store

log = logging.getLogger(__name__)

MAX_JSON_IMPORT = 512 << 20
_LEADING = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*")  # a UTF-8 BOM, then JSON whitespace


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
        with open_regular(path) as f:
            head = f.read(4)
    except OSError as exc:
        raise FormatError(f"cannot read {path.name}: {exc.strerror or exc}") from exc
    if head.startswith(b"PK"):
        return read_session(path, identity=identity)
    data = read_regular(path, MAX_JSON_IMPORT)
    leading = _LEADING.match(data)  # always matches; no copy of the data, unlike lstrip()
    start = leading.end() if leading else 0
    first = data[start:start + 1]
    if first == b"[":
        return SessionContents(parse_chatgpt(data, max_bytes=MAX_JSON_IMPORT))
    if first == b"{":
        return SessionContents([parse_openai_messages(data)])
    raise FormatError(
        f"{path.name} is not a session file, a ChatGPT export or OpenAI chat messages"
    )


@dataclass(frozen=True)
class ParsedImport:
    """A file read, checked and turned into trees: all the work of an import but the write."""

    contents: SessionContents
    trees: tuple[Tree, ...]  # one per conversation, built off the thread that owns the store

    @property
    def conversations(self) -> list[ConversationRecord]:
        return self.contents.conversations

    @property
    def checkpoints(self) -> list[SessionCheckpoint]:
        return self.contents.checkpoints

    @property
    def dropped_checkpoints(self) -> int:
        return self.contents.dropped_checkpoints


def parse_import(
    path: Path, *, identity: Identity | None = None, cancel: threading.Event | None = None
) -> ParsedImport:
    """Everything an import does short of the store: read, parse, validate, apply the limits.

    It needs no store and changes nothing, so it may run on any thread (the app runs it off
    the GUI thread: a large ChatGPT export takes seconds). What it returns already passed every
    check the store makes, so `commit_import` only writes. Raises an ArborError subclass with a
    one-line message: FormatError for a rejected file, Cancelled once `cancel` is set. The
    format readers have no cancellation points, so `cancel` is seen between the stages only.
    """
    _check_cancel(cancel)
    contents = read_any(path, identity=identity)
    _check_cancel(cancel)
    if not contents.conversations:  # e.g. an empty ChatGPT export: nothing to add is an error
        raise FormatError(f"{path.name} holds no conversations")
    trees: list[Tree] = []
    for record in contents.conversations:
        trees.append(to_tree(record))  # linear, but a second of work for a 40 MB export
        if len(trees) % 100 == 0:
            _check_cancel(cancel)
    return ParsedImport(contents, tuple(trees))


def commit_import(
    parsed: ParsedImport, store: Store, *, checkpoints: CheckpointStore | None = None
) -> ImportResult:
    """Add parsed conversations in one transaction: all of them or, on any error, none.

    Runs on the thread that owns `store` (SQLite connections are not shared between threads).
    Failures are StoreError (an ArborError) and leave the store as it was.
    """
    contents = parsed.contents
    ids = store.import_records(contents.conversations, trees=parsed.trees)
    kept = 0
    if checkpoints is not None:
        for item in contents.checkpoints:
            checkpoints.add(item.checkpoint)  # keyed by tokens: found for that conversation
            kept += 1
        checkpoints.enforce_budget()
    dropped = contents.dropped_checkpoints + (len(contents.checkpoints) - kept)
    return ImportResult(ids, [r.title for r in contents.conversations], kept, dropped)


def import_file(
    path: Path,
    store: Store,
    *,
    identity: Identity | None = None,
    checkpoints: CheckpointStore | None = None,
) -> ImportResult:
    """Validate the whole file, then add its conversations in one transaction (the CLI's
    one-call import; the app runs the two steps on different threads)."""
    contents = parse_import(path, identity=identity)
    return commit_import(contents, store, checkpoints=checkpoints)


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


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


__all__ = [
    "ConversationRecord",
    "FileFormat",
    "ImportResult",
    "SessionContents",
    "commit_import",
    "export_file",
    "import_file",
    "parse_import",
    "read_any",
]
