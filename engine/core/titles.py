"""A conversation's title from its first message: a short local heuristic, no model call."""

from __future__ import annotations

import re

NEW_TITLE = "New conversation"  # what a conversation is called until its first message
MAX_TITLE = 48
_LEAD = re.compile(r"^[\s#>*\-+`\d.)]+")


def title_from(text: str) -> str:
    """The first line with words in it, without Markdown's leading marks, cut at a word
    boundary to MAX_TITLE characters (with an ellipsis); NEW_TITLE if there is none."""
    for line in text.splitlines():
        words = " ".join(_LEAD.sub("", line).split())
        if any(c.isalnum() for c in words):
            break
    else:
        return NEW_TITLE
    if len(words) <= MAX_TITLE:
        return words.rstrip(".:;,")
    head = words[: MAX_TITLE + 1]
    cut = head.rsplit(" ", 1)[0] if " " in head else ""
    if len(cut) < MAX_TITLE // 2:  # a long word: cut inside it
        cut = words[:MAX_TITLE]
    return cut.rstrip(".:;,") + "…"
