"""What the streamed readers of XML and Python-like calls share: a call read a character at
a time, up to its end, giving out its arguments' JSON text as far as it is certain."""

from __future__ import annotations

from abc import ABC, abstractmethod


class CallReader(ABC):
    """One call, read a character at a time (`feed`); `take` gives the arguments' canonical
    JSON text that is certain now and was not taken before."""

    def __init__(self) -> None:
        self.name: str | None = None  # once whole
        self.broken = False  # not a call of this syntax: nothing more of it is streamed
        self._out: list[str] = []

    @property
    @abstractmethod
    def done(self) -> bool:
        """Whether the call has ended."""

    @abstractmethod
    def _read(self, ch: str) -> None:
        """One more character of the call."""

    def _pending(self) -> str:
        """What the value being read can give out now (none between values)."""
        return ""

    def take(self) -> str:
        self._out.append(self._pending())
        out = "".join(self._out)
        self._out.clear()
        return out

    def feed(self, text: str) -> int:
        """Read `text` up to the call's end; how many characters were the call's."""
        for at, ch in enumerate(text):
            if self.done:
                return at
            self._read(ch)
        return len(text)
