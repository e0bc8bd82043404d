"""`arbor --self-test`: the program checks itself, headless, on a temporary base folder.

It opens the real window offscreen with the engine in its own process, loads the default
model, answers two messages, edits the second and checks that the reply after the edit
(prepared from what the cache kept of the first turn) equals a full reprocess of the same
path, then writes a session file and reads it back. Exit 0, or 1 with the step that
failed. Every packaged build runs it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TIMEOUT_MS = 300_000  # a hang guard: each wait ends as soon as its signal comes
SYSTEM = "You answer in one short sentence."
FIRST, SECOND, EDITED = "Name a colour.", "Name an animal.", "Name a fruit."


class SelfTestFailed(Exception):
    pass


def run_self_test() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="arbor-self-test-") as home:
        os.environ["ARBOR_HOME"] = home
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        try:
            _run(Path(home), _say)
        except SelfTestFailed as exc:
            _say(f"FAILED: {exc}")
            return 1
        except Exception as exc:  # anything at all: the test's answer is still one line
            _say(f"FAILED: {type(exc).__name__}: {exc}")
            return 1
    _say(f"passed in {time.monotonic() - started:.1f} s")
    return 0


def _say(line: str) -> None:
    sys.stdout.write(f"arbor self-test: {line}\n")
    sys.stdout.flush()


def _run(home: Path, say: Callable[[str], None]) -> None:
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from app.state.engine_client import ProcessEngine
    from app.window.main_window import MainWindow
    from engine.config.settings import Settings
    from engine.llm.runtime import Runtime
    from engine.models.files import default_model_path
    from engine.service.session import GenerationOptions, Session
    from engine.storage.store import Store
    from engine.storage.transfer import FileFormat, export_file, import_file

    app = QApplication.instance() or QApplication(sys.argv[:1])

    def wait(signal: object, what: str) -> None:
        loop = QEventLoop()
        fired: list[bool] = []

        def done(*_args: object) -> None:
            fired.append(True)
            loop.quit()

        signal.connect(done)  # type: ignore[attr-defined]
        QTimer.singleShot(TIMEOUT_MS, loop.quit)
        loop.exec()
        signal.disconnect(done)  # type: ignore[attr-defined]
        if not fired:
            raise SelfTestFailed(f"{what}: no answer within {TIMEOUT_MS // 1000} s")

    settings = Settings(temperature=0.0, max_tokens=16, seed=1, disk_tier=False)
    model = default_model_path()
    window = MainWindow(store=Store(home / "conversations.db"), settings=settings,
                        engine=ProcessEngine())
    try:
        window.models.load_model(str(model))
        wait(window.model_ready, "loading the model")
        loaded = window.replies.model
        assert loaded is not None
        kernels = dict(loaded.details).get("kernels", "?")
        say(f"loaded {model.name} ({loaded.backend}, llama.cpp CPU library {kernels}) in an "
            f"engine process of its own")
        window.controller.set_system_prompt(SYSTEM)
        for text in (FIRST, SECOND):
            window.controller.send(text)
            wait(window.reply_finished, f"the reply to {text!r}")
            reply = window.tree.messages()[-1].text
            if not reply:
                raise SelfTestFailed(f"the reply to {text!r} is empty")
            say(f"replied: {reply!r}")
        asked = window.tree.messages()[2]
        window.controller.edit(asked.id, EDITED)
        wait(window.reply_finished, "the reply after the edit")
        edited = window.tree.messages()[-1].text
        report = window.replies.last_reply
        how = f"{report.source}, {report.decoded_tokens} of {report.prompt_tokens} prompt " \
              f"tokens decoded" if report is not None else "no report"
        say(f"after the edit ({how}): {edited!r}")
        if report is None or report.reused_tokens == 0:
            raise SelfTestFailed("the reply after the edit reused nothing of the first turn")
        conversation = window.current
        assert conversation is not None
    finally:
        window.close()
        window.deleteLater()
        app.processEvents()

    from engine.files.documents import document_from_bytes
    from engine.llm.llama import multimodal_marker

    say(f"libmtmd loads (its media marker: {multimodal_marker()})")
    page = document_from_bytes("self-test.html", b"<p>Attached <b>page</b></p>", seconds=120)
    if page.text != "Attached page":
        raise SelfTestFailed(f"a document read in the reader's process gave {page.text!r}")
    say("read a document in a reader process of its own")
    runtime = Runtime(model, settings.runtime())
    try:
        reference = Session(runtime, system=SYSTEM, sampling=settings.sampling(),
                            use_cache=False)
        options = GenerationOptions(max_tokens=16, seed=1)
        reference.send(FIRST, options)
        expected = reference.send(EDITED, options).text
    finally:
        runtime.close()
    if edited != expected:
        raise SelfTestFailed(f"the reply after the edit differs from a full reprocess: "
                             f"{edited!r} != {expected!r}")
    say("the reply after the edit equals a full reprocess")

    out = home / "self-test.arbor"
    with Store(home / "conversations.db") as store:
        export_file(store, [conversation], out, FileFormat.NATIVE)
        saved = [n.text for n in store.load(conversation).messages()]
    with Store(home / "imported.db") as other:
        result = import_file(out, other)
        back = [n.text for n in other.load(result.conversation_ids[0]).messages()]
    if back != saved:
        raise SelfTestFailed(f"the session file read back differs: {back} != {saved}")
    say(f"wrote and read a session file ({out.stat().st_size:,} bytes)")
