"""Documents attached to a user's message: parts of its node, decoded once before its text.

A user node keeps its attached documents under `DOCUMENTS` in its meta (their extracted text,
file name, kind, sha256 and size: `engine.files.documents` reads the files). The model reads
the message as each document in a block that names its file, then what the user wrote
(`message_content`); a block's text is content like any other, never parsed for control tokens
(docs/architecture.md, "Message content stays text"). The documents come first so that an edit
of the question, another question after the same document or a regenerate shares the decoded
document: the schedule has a mark where the last document ends (`PromptBuilder.marks`), and
a checkpoint is kept there, so only the question is decoded again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

DOCUMENTS = "documents"  # user node meta: the attached documents, as `Document.to_meta`


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

    def to_meta(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind.value, "text": self.text,
                "sha256": self.sha256, "size": self.size}

    @staticmethod
    def from_meta(raw: object) -> Document | None:
        if not isinstance(raw, Mapping):
            return None
        name, kind, text = raw.get("name"), raw.get("kind"), raw.get("text")
        sha256, size = raw.get("sha256"), raw.get("size")
        if not (isinstance(name, str) and isinstance(text, str) and isinstance(sha256, str)
                and isinstance(size, int) and kind in DocumentKind._value2member_map_):
            return None
        return Document(name, DocumentKind(str(kind)), text, sha256, size)


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
