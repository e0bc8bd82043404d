"""Engine processes that die at once, for the crash-loop test: spawned by reference, so they
live in an importable module (a spawned child imports its target anew)."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection


def abort_at_start(conn: Connection, *_args: object) -> None:
    """An engine that aborts before it says anything, as one with a broken build would."""
    conn.close()
    os.abort()
