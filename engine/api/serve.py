"""`arbor-engine serve`: the local API on the command line's terms."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from engine.api.engines import OwnEngine
from engine.api.server import Server, ServerOptions, check_binding, model_id_of
from engine.api.trees import LocalTrees
from engine.api.worker import ApiWorker
from engine.config.settings import Settings

log = logging.getLogger(__name__)


# On Ctrl+C: how long the reply running may take to stop, and the engine to exit, before
# each is given up on (a stopped or hung engine is killed).
STOP_TIMEOUT_S = 3.0


def serve(model: Path, settings: Settings, db: Path | None, options: ServerOptions) -> None:
    """Load the model (in an engine process of its own), then answer until interrupted.
    Raises ValueError for a binding that needs --allow-remote and a key, ArborError when the
    model cannot be loaded, OSError when the address is taken; KeyboardInterrupt after a
    Ctrl+C, once the requests waiting were answered 503 and the engine has ended."""
    check_binding(options)
    engine = OwnEngine(model, settings)
    worker = ApiWorker(lambda: LocalTrees(db), engine)
    try:
        worker.start()
        server = Server(worker, lambda: model_id_of(model), options)
        loaded = engine.loaded()
        assert loaded is not None

        def started() -> None:
            sys.stderr.write(f"arbor-engine: serving {loaded.name} ({loaded.memory_kind}, "
                             f"{loaded.n_ctx} tokens of context) at {server.url}\n")
            sys.stderr.flush()

        server.run(on_started=started)
    finally:
        # The reply running stops within a token; one that does not (a silent engine) ends
        # with the engine, whose end the worker then reads.
        ended = worker.close(timeout=STOP_TIMEOUT_S)
        engine.close(timeout=STOP_TIMEOUT_S)
        if not ended:
            worker.close()
