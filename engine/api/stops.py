"""Stop sequences: text is passed on only once no stop sequence can start inside it."""

from __future__ import annotations

from collections.abc import Sequence


def held_from(text: str, patterns: Sequence[str], hold: int) -> int:
    """Where the longest end of `text` that may begin one of `patterns` starts (at most
    `hold` from the end); the text's length when no end may."""
    for start in range(max(0, len(text) - hold), len(text)):
        tail = text[start:]
        if any(p.startswith(tail) for p in patterns):
            return start
    return len(text)


class StopScanner:
    """Feed the reply's pieces; get back what may be shown. After a stop sequence, `hit` is
    True and `text` is the reply up to it (the sequence itself is not part of the reply)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""  # everything received, cut at the stop once hit
        self._shown = 0
        self.hit = False

    def feed(self, piece: str) -> str:
        if self.hit:
            return ""
        self.text += piece
        found = [i for i in (self.text.find(s, max(0, self._shown - self._hold))
                             for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            self.text = self.text[: min(found)]
            return self._release(len(self.text))
        return self._release(held_from(self.text, self.stops, self._hold))

    def flush(self) -> str:
        """The rest, once the reply ended without a stop sequence."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self._shown:
            return ""
        out, self._shown = self.text[self._shown:upto], upto
        return out


class CallHoldback:
    """With tools offered, the text of a tool call is not content: what may begin one is
    held back (the markers, and with `at_open` a reply that opens with a JSON object, as Llama
    3's calls are written), and once one begins nothing more is passed on as text: the calls
    go out as `tool_calls` deltas (engine.api.calls), and what the reply said besides comes
    when it ends (engine.core.tools parses the calls where the template is known)."""

    def __init__(self, markers: Sequence[str], *, at_open: bool = True) -> None:
        self.markers = tuple(markers)
        self.at_open = at_open
        self._hold = max((len(m) for m in self.markers), default=1) - 1
        self.text = ""
        self.shown = ""  # what was passed on as content
        self.calling = False
        self.marker: str | None = None  # the marker the call began with (None: a JSON object)
        self.begun = 0  # where in `text` the call's own text begins (after its marker)

    def feed(self, piece: str) -> str:
        if self.calling:
            return ""
        self.text += piece
        body = self.text.lstrip()
        if self.at_open and body.startswith("{"):
            self.calling = True
            self.begun = len(self.text) - len(body)
            return ""
        found = [(i, m) for i, m in ((self.text.find(m), m) for m in self.markers) if i >= 0]
        if found:
            at, self.marker = min(found)
            self.calling = True
            self.begun = at + len(self.marker)
            return self._release(at)
        if not body and self.at_open:
            return ""  # a reply may still open with a JSON call
        return self._release(held_from(self.text, self.markers, self._hold))

    def _release(self, upto: int) -> str:
        if upto <= len(self.shown):
            return ""
        out = self.text[len(self.shown):upto]
        self.shown += out
        return out
