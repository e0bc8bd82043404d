"""An attached document is decoded once: every question after it decodes only itself.

On every memory kind: a document and a question, an edit of the question, a follow-up on
the first branch after a switch back and a regenerate give the replies a full reprocess of
each path gives, and every step after the first restores the state at the document's end
(a checkpoint there, on every kind) rather than decoding the document again.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest

from engine.core.attachments import Document, DocumentKind, documents_of, message_content
from engine.core.memory import MemoryKind
from engine.llm.llama import SamplingParams
from engine.llm.runtime import Runtime, RuntimeSettings
from engine.service.session import GenerationOptions, Session
from engine.storage.checkpoints import CheckpointStore
from tests.conftest import ALL_KINDS

WORDS = ["river", "stone", "lantern", "orchard", "copper", "meadow", "harbor", "violet",
         "ember", "quartz", "thistle", "canyon", "willow", "saffron", "glacier"]
TEXT = "\n".join(" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12))
                 for i in range(60))
DOC = Document("field-notes.txt", DocumentKind.TEXT, TEXT,
               hashlib.sha256(TEXT.encode()).hexdigest(), len(TEXT))
OPTIONS = GenerationOptions(max_tokens=6)


def _steps(session: Session) -> list[tuple[str, int, int]]:
    """The scenario; for each step, (its reply, tokens reused, prompt tokens)."""
    out = []

    def step(report: object) -> None:
        result = getattr(report, "report", None)
        node_id = getattr(report, "node_id", None)
        assert result is not None and node_id is not None
        out.append((session.tree.node(node_id).text, result.reused_tokens,
                    result.prompt_tokens))

    first = session.send("Which words appear?", OPTIONS, documents=[DOC])
    step(first)
    question = session.tree.node(first.node_id or -1).parent
    assert question is not None
    step(session.edit(question, "Which word comes first?", OPTIONS))
    session.switch(question, 0)
    step(session.send("And the last one?", OPTIONS))
    step(session.regenerate(OPTIONS))
    return out


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_questions_after_a_document_decode_only_themselves_and_match_a_reprocess(
    kind: MemoryKind, tiny_models: dict[str, Path]
) -> None:
    runs = {}
    for use_cache in (True, False):
        runtime = Runtime(tiny_models[kind.value], RuntimeSettings(n_ctx=2048, n_batch=64))
        try:
            store = CheckpointStore(runtime.identity()) if use_cache else None
            session = Session(runtime, system="S", seed=3, use_cache=use_cache,
                              checkpoints=store, sampling=SamplingParams(temperature=0.8))
            runs[use_cache] = _steps(session)
            if use_cache:
                assert session.generator is not None
                user = session.tree.path_to(session.tree.active_leaf)[1]
                assert documents_of(user.meta) == (DOC,)
                path = session.tree.path_to(user.id)
                end = session.generator.prompts.document_ends(path)
                assert len(end) == 1 and end[0] > 500  # the document's tokens
                assert store is not None and end[0] in {c.n_tokens for c in store.all()}
                doc_end = end[0]
        finally:
            runtime.close()
    cached, reference = runs[True], runs[False]
    assert [text for text, _, _ in cached] == [text for text, _, _ in reference]
    # The edit decodes only the new question; the follow-up after the switch back and its
    # regenerate restore past the document too.
    for text, reused, prompt in cached[1:]:
        assert reused >= doc_end, (text, reused, doc_end)
        assert prompt - reused < doc_end // 2
    assert all(reused == 0 for _, reused, _ in reference)


def test_the_model_reads_the_documents_before_the_message() -> None:
    content = message_content("What is it?", [DOC])
    assert content.startswith('<document name="field-notes.txt">\n' + TEXT + "\n</document>")
    assert content.endswith("\n\nWhat is it?")
    assert message_content("Hi", []) == "Hi"


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_the_state_after_a_document_survives_a_restart_in_the_disk_tier(
    kind: MemoryKind, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """A restart: a new engine and store on the same disk tier and the same tree. An edit
    of the question restores the document's state from disk and answers as a reprocess."""
    settings = RuntimeSettings(n_ctx=2048, n_batch=64)
    key = b"k" * 32
    runtime = Runtime(tiny_models[kind.value], settings)
    try:
        store = CheckpointStore(runtime.identity(), key=key, ram_budget=0, disk_dir=tmp_path)
        session = Session(runtime, system="S", seed=3, checkpoints=store,
                          sampling=SamplingParams(temperature=0.8))
        first = session.send("Which words appear?", OPTIONS, documents=[DOC])
        tree = session.tree
        assert session.generator is not None
        question = tree.node(first.node_id or -1).parent
        assert question is not None
        (doc_end,) = session.generator.prompts.document_ends(tree.path_to(question))
        assert doc_end in {c.n_tokens for c in store.all()}
    finally:
        runtime.close()
    answers = []
    for use_cache in (True, False):
        runtime = Runtime(tiny_models[kind.value], settings)
        try:
            store = CheckpointStore(runtime.identity(), key=key, ram_budget=0,
                                    disk_dir=tmp_path) if use_cache else None
            again = Session(runtime, tree=copy.deepcopy(tree), seed=3, use_cache=use_cache,
                            checkpoints=store, sampling=SamplingParams(temperature=0.8))
            edited = again.edit(question, "Which word comes last?", OPTIONS)
            assert edited.report is not None and edited.node_id is not None
            if use_cache:
                assert edited.report.reused_tokens >= doc_end, edited.report
            answers.append(again.tree.node(edited.node_id).text)
        finally:
            runtime.close()
    assert answers[0] == answers[1]
