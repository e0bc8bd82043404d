"""Engine processes that fail on purpose, for the crash tests: spawned by reference, so they
live in an importable module (a spawned child imports its target anew)."""

from __future__ import annotations

import os
import signal
from multiprocessing.connection import Connection


def abort_at_start(conn: Connection, *_args: object) -> None:
    """An engine that aborts before it says anything, as one with a broken build would."""
    conn.close()
    os.abort()


def _segfault() -> None:
    """Die as llama.cpp's kernels do when they fault: SIGSEGV (faulthandler reports it)."""
    os.kill(os.getpid(), signal.SIGSEGV)


def faults_while_repacking(conn: Connection, *args: object) -> None:
    """The real engine, on a build whose repacked-weight kernels fault on this CPU: the
    load's canary batch dies while weights are repacked, and runs without them."""
    import engine.llm.runtime
    import engine.service.process

    canary = engine.llm.runtime.Runtime._canary

    def faulting_canary(self: engine.llm.runtime.Runtime) -> None:
        if self.repack:
            _segfault()
        canary(self)

    engine.llm.runtime.Runtime._canary = faulting_canary  # type: ignore[method-assign]
    engine.service.process.child_main(conn, *args)  # type: ignore[arg-type]


def faults_on_the_first_prompt(conn: Connection, *args: object) -> None:
    """Kernels that pass the canary and fault on the first real prompt (a larger batch takes
    another kernel), while weights are repacked."""
    import engine.llm.runtime
    import engine.service.process

    prepare = engine.llm.runtime.Runtime.prepare

    def faulting_prepare(self: engine.llm.runtime.Runtime, *a: object, **kw: object) -> object:
        if self.repack:
            _segfault()
        return prepare(self, *a, **kw)  # type: ignore[arg-type]

    engine.llm.runtime.Runtime.prepare = faulting_prepare  # type: ignore[assignment,method-assign]
    engine.service.process.child_main(conn, *args)  # type: ignore[arg-type]
