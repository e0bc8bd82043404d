"""Documents attached to a user's message: parts of its node, decoded once before its text.

A user node keeps its attached documents under `DOCUMENTS` in its meta (their extracted text,
file name, kind, sha256 and size: `engine.files.documents` reads the files). The model reads
the message as each document in a block that names its file, then what the user wrote
(`message_content`); a block's text is content like any other, never parsed for control tokens
(docs/architecture.md, "Message content stays text"). The documents come first so that an edit
of the question, another question after the same document or a regenerate shares the decoded
document: the schedule has a mark where the last document ends (`PromptBuilder.marks`), and
a checkpoint is kept there, so only the question is decoded again.

A document longer than the context is never cut silently: the user chooses (`Reading`) to
give the model its start, or to search it, so that each message reads the passages that best
match it (`passages`, ranked by SQLite's FTS5). Searched passages belong to the message: an
edit of it searches again, and its node's tokens hold what it read.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

DOCUMENTS = "documents"  # user node meta: the attached documents, as `Document.to_meta`


class Reading(StrEnum):
    """How much of a document the model reads: a document longer than the context is never
    cut silently; the user chooses its start or the passages a question needs."""

    WHOLE = "whole"
    START = "start"  # its first `budget` characters
    SEARCH = "search"  # the passages of `source` that best match the message, `budget` long


class DocumentKind(StrEnum):
    TEXT = "text"
    MARKDOWN = "markdown"
    CODE = "code"
    HTML = "html"
    PDF = "pdf"
    DOCX = "docx"


@dataclass(frozen=True)
class Document:
    """An attached file's text, with what identifies the file it came from."""

    name: str  # the file's name, as shown (content: never parsed for control tokens)
    kind: DocumentKind
    text: str
    sha256: str  # of the file's bytes
    size: int  # the file's bytes
    reading: Reading = Reading.WHOLE
    source: str = ""  # SEARCH: the whole text the passages come from
    budget: int = 0  # START, SEARCH: the characters the model may read
    whole: int = 0  # START, SEARCH: the characters of the whole text

    def to_meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind.value, "text": self.text,
                               "sha256": self.sha256, "size": self.size}
        if self.reading is not Reading.WHOLE:
            out.update(reading=self.reading.value, budget=self.budget, whole=self.whole)
            if self.source:
                out["source"] = self.source
        return out

    @property
    def reads(self) -> int:
        """The most characters the model reads of it (a searched one: its budget)."""
        return self.budget if self.reading is Reading.SEARCH else len(self.text)

    def start(self, budget: int) -> Document:
        """The document cut to its first `budget` characters (at a line or a word), with a
        last line that says so, for the model and the reader."""
        if len(self.text) <= budget:
            return self
        cut = self.text.rfind("\n", 0, budget)
        if cut < budget // 2:
            cut = self.text.rfind(" ", 0, budget)
        cut = cut if cut > budget // 2 else budget
        note = f"\n\n[cut here: the first {cut:,} of {len(self.text):,} characters]"
        return replace(self, text=self.text[:cut] + note, reading=Reading.START,
                       budget=budget, whole=len(self.text))

    def searched(self, budget: int) -> Document:
        """The document read as the passages each message asks for (`for_message`)."""
        whole = self.source or self.text
        return replace(self, text="", reading=Reading.SEARCH, source=whole, budget=budget,
                       whole=len(whole))

    def for_message(self, text: str) -> Document:
        """What the model reads of the document beside the message `text`: under SEARCH,
        the passages that best match it, in the document's order (`passages`)."""
        if self.reading is not Reading.SEARCH:
            return self
        return replace(self, text=passages(self.source, text, self.budget))

    @staticmethod
    def from_meta(raw: object) -> Document | None:
        if not isinstance(raw, Mapping):
            return None
        name, kind, text = raw.get("name"), raw.get("kind"), raw.get("text")
        sha256, size = raw.get("sha256"), raw.get("size")
        if not (isinstance(name, str) and isinstance(text, str) and isinstance(sha256, str)
                and isinstance(size, int) and kind in DocumentKind._value2member_map_):
            return None
        reading, source = raw.get("reading", Reading.WHOLE.value), raw.get("source", "")
        budget, whole = raw.get("budget", 0), raw.get("whole", 0)
        if not (reading in Reading._value2member_map_ and isinstance(source, str)
                and isinstance(budget, int) and isinstance(whole, int)):
            return None
        return Document(name, DocumentKind(str(kind)), text, sha256, size,
                        Reading(str(reading)), source, budget, whole)


PASSAGE = 1200  # characters: a passage is a few paragraphs
_WORD = re.compile(r"\w{2,}", re.UNICODE)


def passages(source: str, question: str, budget: int) -> str:
    """The passages of `source` (cut at paragraphs, about PASSAGE characters each) that best
    match `question` by SQLite's FTS5 ranking (bm25), as many as fit `budget` characters, in
    the document's order, each headed with its number. A function of its arguments alone,
    so a message's passages are the same whenever they are chosen again."""
    chunks = _chunks(source)
    terms = sorted({w.lower() for w in _WORD.findall(question)})
    order: list[int] = []
    if terms:
        with contextlib.closing(sqlite3.connect(":memory:")) as db:
            db.execute("CREATE VIRTUAL TABLE chunk USING fts5(body)")
            db.executemany("INSERT INTO chunk(rowid, body) VALUES (?, ?)",
                           enumerate(chunks))
            query = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
            order = [row[0] for row in db.execute(
                "SELECT rowid FROM chunk WHERE chunk MATCH ? ORDER BY bm25(chunk), rowid",
                (query,))]
    matched = set(order)
    order += [i for i in range(len(chunks)) if i not in matched]  # then from the start
    chosen: list[int] = []
    used = 0
    for index in order:
        cost = len(chunks[index]) + 40
        if used + cost > budget:
            continue
        chosen.append(index)
        used += cost
    parts = [f"[passage {i + 1} of {len(chunks)}]\n{chunks[i]}" for i in sorted(chosen)]
    return "\n\n".join(parts) if parts else "[no passage of it fits the context]"


def _chunks(text: str) -> list[str]:
    out: list[str] = []
    current = ""
    for paragraph in text.split("\n\n"):
        while len(paragraph) > PASSAGE:  # a paragraph longer than a passage: cut at a space
            cut = paragraph.rfind(" ", PASSAGE // 2, PASSAGE)
            cut = cut if cut > 0 else PASSAGE
            if current:
                out.append(current)
                current = ""
            out.append(paragraph[:cut])
            paragraph = paragraph[cut:].lstrip()
        if current and len(current) + len(paragraph) + 2 > PASSAGE:
            out.append(current)
            current = ""
        current = f"{current}\n\n{paragraph}" if current else paragraph
    if current:
        out.append(current)
    return out


def documents_of(meta: Mapping[str, Any]) -> tuple[Document, ...]:
    raw = meta.get(DOCUMENTS)
    if not isinstance(raw, list):
        return ()
    found = (Document.from_meta(item) for item in raw)
    return tuple(d for d in found if d is not None)


def document_block(document: Document) -> str:
    """A document as the model reads it."""
    return f'<document name="{document.name}">\n{document.text}\n</document>'


def message_content(text: str, documents: Sequence[Document]) -> str:
    """A user message's content for the chat template: its documents, then its text."""
    if not documents:
        return text
    return "\n\n".join([*(document_block(d) for d in documents), *([text] if text else [])])
