"""Session operations beyond the replay ops: stopping a reply and continuing it later."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.memory import MemoryKind
from engine.core.tree import NodeStatus
from engine.llm.llama import SamplingParams
from engine.llm.runtime import Runtime, RuntimeSettings
from engine.service.client import InProcessClient, Receive
from engine.service.protocol import Event, Piece
from engine.service.session import GenerationOptions, Session
from engine.storage.checkpoints import CheckpointStore
from engine.storage.store import Store, StoreSink
from tests.conftest import ALL_KINDS


def _stop_after(n: int, session: Session, monkeypatch: pytest.MonkeyPatch) -> GenerationOptions:
    """A stop the engine sees right after its `n`th piece, whatever the threads' timing.

    A `cancel` is polled on the caller's thread, so the engine may sample another token or
    two before the stop reaches it. Here the stop is set on the engine's thread as it hands
    out the `n`th piece, before it samples the next token: both runs a test compares stop at
    the same token."""
    engine = session.engine
    assert isinstance(engine, InProcessClient)
    tap = engine.tap

    def counting_tap(request_id: int, receive: Receive | None) -> None:
        if receive is None:
            tap(request_id, None)
            return
        pieces = 0

        def counted(event: Event) -> None:
            nonlocal pieces
            if isinstance(event, Piece):
                pieces += 1
                if pieces == n:
                    engine.stop(request_id)
            receive(event)

        tap(request_id, counted)

    monkeypatch.setattr(engine, "tap", counting_tap)
    return GenerationOptions(max_tokens=40)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warmed"])
@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_an_interrupted_reply_continues_exactly_as_a_full_reprocess_would(
    kind: MemoryKind, warm: bool, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a warm-up between the stop and the Continue (the app's, while the user reads),
    the Continue decodes nothing; without one, it decodes the reply's tokens again."""
    texts = []
    for use_cache in (True, False):
        runtime = Runtime(tiny_models[kind.value], RuntimeSettings(n_ctx=1024, n_batch=32))
        try:
            store = CheckpointStore(runtime.identity()) if use_cache else None
            session = Session(runtime, system="S", seed=4, use_cache=use_cache, checkpoints=store,
                              sampling=SamplingParams(temperature=0.9))
            session.send("Tell me a story.", GenerationOptions(max_tokens=6))
            with monkeypatch.context() as patch:
                stopped = session.send("Another one.", _stop_after(3, session, patch))
            reply = session.tree.node(stopped.node_id or -1)
            assert reply.status is NodeStatus.INTERRUPTED and stopped.report is not None
            assert stopped.report.generated_tokens == 3
            partial = reply.text
            if warm:
                warmed = session.warm(GenerationOptions(max_tokens=8))
                assert (warmed.report is not None) == use_cache  # the reference warms nothing
            resumed = session.resume(reply.id, GenerationOptions(max_tokens=8))
            assert resumed.node_id == reply.id
            assert reply.text.startswith(partial) and len(reply.text) > len(partial)
            assert reply.status is NodeStatus.COMPLETE
            assert resumed.report is not None
            if use_cache:
                assert resumed.report.reused_tokens > 0
                assert (resumed.report.decoded_tokens == 0) == warm
            session.send("And then?", GenerationOptions(max_tokens=6))
            texts.append([n.text for n in session.tree.messages()])
        finally:
            runtime.close()
    assert texts[0] == texts[1]


def test_a_reply_cut_by_a_crash_reopens_interrupted_and_continues(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    db = tmp_path / "c.db"
    runtime = Runtime(tiny_models["dense"], RuntimeSettings(n_ctx=1024, n_batch=32))
    try:
        store = Store(db)
        session = Session(runtime, seed=2)
        cid = store.create(session.tree, title="t")
        session.sink = StoreSink(store, cid, interval_s=0.0)

        class Crash(Exception):
            pass

        def crash_after_three(piece: str, seen: list[str] = []) -> None:  # noqa: B006
            seen.append(piece)
            if len(seen) == 3:
                raise Crash

        with pytest.raises(Crash):
            session.send("Hello", GenerationOptions(max_tokens=20, on_text=crash_after_three))
        store.close()  # the "process" is gone; what the store saw is what survives

        with Store(db) as reopened:
            tree = reopened.load(cid)
            reply = tree.message(1)
            assert reply.status is NodeStatus.INTERRUPTED and reply.text
            revived = Session(runtime, tree, seed=2, sink=StoreSink(reopened, cid))
            revived.resume(reply.id, GenerationOptions(max_tokens=5))
            assert reopened.load(cid).message(1).status is NodeStatus.COMPLETE
    finally:
        runtime.close()


def test_the_reply_exists_while_its_prompt_is_prepared_and_a_failed_prepare_takes_it_back(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """As in the window: a streaming reply is saved before the prompt is decoded (a crash
    then leaves an interrupted reply, not a silent gap), and a prompt that does not fit
    leaves the conversation as it was, with one clear error."""
    from engine.core.errors import ContextOverflowError
    from engine.core.tree import Role

    runtime = Runtime(tiny_models["dense"], RuntimeSettings(n_ctx=256, n_batch=32))
    store = Store(tmp_path / "c.db")
    try:
        session = Session(runtime, seed=1)
        cid = store.create(session.tree, title="t")
        session.sink = StoreSink(store, cid)
        seen: list[list[str]] = []

        def during_prepare(_done: int, _total: int) -> None:
            saved = store.load(cid)
            seen.append([n.status.value for n in saved.nodes() if n.role is Role.ASSISTANT])

        session.send("Hello.", GenerationOptions(max_tokens=4, on_progress=during_prepare))
        assert seen and seen[0] == ["streaming"]
        before = [(n.id, n.text) for n in store.load(cid).nodes()]
        with pytest.raises(ContextOverflowError):
            session.send("word " * 400, GenerationOptions(max_tokens=4))
        after = store.load(cid)
        assert [n.role for n in after.nodes()].count(Role.ASSISTANT) == 1
        assert [(n.id, n.text) for n in after.nodes()][: len(before)] == before
        assert after.node(after.active_leaf).text.startswith("word")  # the message is kept
    finally:
        store.close()
        runtime.close()
