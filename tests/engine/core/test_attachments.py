"""A document longer than the context: its start, or the passages each message asks for."""

from __future__ import annotations

import re

from engine.core.attachments import (
    DOCUMENTS,
    Document,
    DocumentKind,
    Reading,
    documents_of,
    passages,
)
from engine.core.conversation import Conversation
from engine.core.tree import Tree

CHAPTERS = [f"Chapter {n}. " + " ".join(["filler words about nothing much"] * 30)
            for n in range(40)]
CHAPTERS[7] += " The lighthouse keeper kept a logbook of storms."
CHAPTERS[31] += " The orchard was planted with quince and medlar trees."
BOOK = "\n\n".join(CHAPTERS)
DOC = Document("book.txt", DocumentKind.TEXT, BOOK, "c" * 64, len(BOOK))


def test_the_start_is_cut_at_a_line_and_says_so() -> None:
    start = DOC.start(5000)
    assert start.reading is Reading.START and start.whole == len(BOOK)
    body, note = start.text.rsplit("\n\n[cut here: ", 1)
    assert BOOK.startswith(body) and len(body) <= 5000 and BOOK[len(body)] == "\n"
    assert note == f"the first {len(body):,} of {len(BOOK):,} characters]"
    assert DOC.start(len(BOOK)) is DOC  # it fits: read whole
    assert Document.from_meta(start.to_meta()) == start


def test_a_searched_document_gives_each_message_its_best_passages() -> None:
    searched = DOC.searched(1500)  # room for one passage
    assert searched.text == "" and searched.source == BOOK and searched.reads == 1500
    storms = searched.for_message("What did the lighthouse keeper write about storms?")
    assert storms.text.startswith("[passage 8 of")
    assert "lighthouse keeper kept a logbook" in storms.text
    assert "quince" not in storms.text and len(storms.text) <= 1500
    # With more room, more passages, in the document's order.
    more = DOC.searched(6000).for_message("lighthouse storms")
    numbers = [int(n) for n in re.findall(r"\[passage (\d+) of", more.text)]
    assert 8 in numbers and numbers == sorted(numbers) and len(numbers) > 1
    trees = searched.for_message("Which trees grew in the orchard?")
    assert "quince and medlar" in trees.text
    # The same question, the same passages: a function of its arguments alone.
    assert passages(BOOK, "orchard trees", 3000) == passages(BOOK, "orchard trees", 3000)
    assert Document.from_meta(trees.to_meta()) == trees


def test_an_edit_searches_again_for_the_new_question() -> None:
    conversation = Conversation(Tree("S"))
    change = conversation.send("Tell me about the lighthouse.", [DOC.searched(1500)])
    (user,) = change.nodes
    (first,) = documents_of(user.meta)
    assert "lighthouse keeper" in first.text
    edited = conversation.edit(user.id, "Tell me about the orchard.").nodes[0]
    (second,) = documents_of(edited.meta)
    assert "quince" in second.text and "lighthouse keeper" not in second.text
    assert second.source == BOOK and edited.meta[DOCUMENTS] != user.meta[DOCUMENTS]
