"""The kinds of memory a model's cache has: what going back in a conversation costs on it."""

from __future__ import annotations

from enum import StrEnum


class MemoryKind(StrEnum):
    """How the model's cache behaves when a conversation goes back (docs/architecture.md,
    "Memory kinds")."""

    DENSE = "dense"
    SLIDING_WINDOW = "sliding_window"
    RECURRENT = "recurrent"
    HYBRID = "hybrid"
