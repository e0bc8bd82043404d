"""File formats Arbor reads and writes besides its own session files.

Every importer treats its input as hostile: a file either becomes well-formed
`ConversationRecord`s or is rejected with a `FormatError` whose message names the problem in
one line, fit to show the user as it is. Nothing else may escape an importer.
"""

from __future__ import annotations

from engine.core.records import ConversationRecord, NodeRecord, RecordError, validate
from engine.files.regular import FormatError


def check_record(record: ConversationRecord) -> None:
    """`records.validate`, but raising FormatError (same message) so callers catch one type."""
    try:
        validate(record)
    except RecordError as error:
        raise FormatError(str(error)) from None


def active_path(record: ConversationRecord) -> list[NodeRecord]:
    """The nodes from the root to the active leaf, both included, of a validated record."""
    by_id = {node.id: node for node in record.nodes}
    path: list[NodeRecord] = []
    current: str | None = record.active_leaf
    while current is not None:
        node = by_id[current]
        path.append(node)
        current = node.parent
    path.reverse()
    return path


__all__ = [
    "FormatError",
    "NotRegularFileError",
    "active_path",
    "check_record",
    "open_regular",
    "read_regular",
]
