"""Markdown export of the active branch: for reading and sharing, not for coming back.

Markdown has no way to hold a tree, so only the path from the root to the active leaf is
written, and a last line says how many other branches were left out. A reply's reasoning
(`engine.core.reasoning`) is written as a collapsed `<details>` block above its answer; its
tool calls as code after it, and a tool's result under its own heading. A message's attached
documents are collapsed blocks above it, each with its file's name and its text verbatim.
"""

from __future__ import annotations

import html
import re

from engine.core.attachments import Document, documents_of
from engine.core.reasoning import ReasoningState, is_opened, split_reasoning
from engine.core.records import ConversationRecord
from engine.core.tools import shown_text
from engine.core.tree import Role
from engine.storage.formats import active_path, check_record

_HEADINGS = {Role.USER: "## User", Role.ASSISTANT: "## Assistant", Role.TOOL: "## Tool result"}


def export_markdown(record: ConversationRecord) -> str:
    """The active branch as Markdown: title, system prompt as a quote, then each message."""
    check_record(record)
    path = active_path(record)
    title = " ".join(record.title.split()) or "Untitled"  # a heading is one line
    blocks = [f"# {title}"]
    if path[0].text:
        blocks.append(_quote(path[0].text))
    for node in path[1:]:
        blocks.append(_HEADINGS[node.role])
        blocks.extend(_document(d) for d in documents_of(node.meta))
        blocks.extend(_reply(shown_text(node.text, node.meta), is_opened(node.meta))
                      if node.role is Role.ASSISTANT else [node.text])
    others = _other_branches(record)
    if others:
        blocks.append(_branches_note(others))
    return "\n\n".join(blocks) + "\n"


def _reply(text: str, opened: bool) -> list[str]:
    """A reply's blocks: its reasoning, if any, folded away above the answer. `opened`: the
    reply began inside its reasoning (its meta says so)."""
    split = split_reasoning(text, opened)
    if split.state is ReasoningState.NONE:
        return [text]
    label = "Reasoning" if split.state is ReasoningState.CLOSED else "Reasoning (unfinished)"
    details = f"<details>\n<summary>{label}</summary>\n\n{split.reasoning}\n\n</details>"
    return [details, split.answer] if split.answer else [details]


def _document(document: Document) -> str:
    """An attached document: folded, its text verbatim (a fence longer than any in it)."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", document.text)),
                                 default=0))
    name = html.escape(document.name)
    return (f"<details>\n<summary>📄 {name}</summary>\n\n{fence}text\n{document.text}\n"
            f"{fence}\n\n</details>")


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.split("\n"))


def _other_branches(record: ConversationRecord) -> int:
    """Branches (root-to-leaf paths) not written: every leaf but the active one."""
    parents = {node.parent for node in record.nodes}
    leaves = [node.id for node in record.nodes if node.id not in parents]
    return sum(1 for leaf in leaves if leaf != record.active_leaf)


def _branches_note(count: int) -> str:
    if count == 1:
        return "_This conversation has 1 other branch; export it as a session file to keep it._"
    return (
        f"_This conversation has {count} other branches; export it as a session file to keep them._"
    )


__all__ = ["export_markdown"]
