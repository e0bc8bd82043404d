"""Exceptions a user can cause. Each carries a message fit to show as it is.

Anything else that escapes the engine is a bug.
"""

from __future__ import annotations

# How much of a value from outside (a file name, a title, a key) a message quotes.
QUOTE_LIMIT = 200


def printable(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`value` as text fit for one line of a message or a terminal: control and format
    characters (newlines, escape sequences, bidi overrides) written as Python escapes, and
    cut to at most `limit` characters (then ending in "...")."""
    try:
        text = str(value)
    except ValueError:  # an int of more digits than Python converts
        text = f"<a {type(value).__name__} too long to show>"
    out: list[str] = []
    length = 0
    for ch in text[: limit + 1]:
        piece = ch if ch.isprintable() else ascii(ch)[1:-1]
        if length + len(piece) > limit:
            return "".join(out) + "..."
        out.append(piece)
        length += len(piece)
    return "".join(out)


class ArborError(Exception):
    """Base class for errors with a user-facing message."""


class ModelNotFoundError(ArborError):
    """The model file does not exist or cannot be read."""


class ModelLoadError(ArborError):
    """The file is not a model llama.cpp can load (corrupt, truncated, unsupported)."""


class ContextOverflowError(ArborError):
    """The prompt does not fit in the context window."""

    def __init__(self, prompt_tokens: int, n_ctx: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"the conversation is {prompt_tokens} tokens long but the context holds {n_ctx} "
            f"(at least one more token is needed for the reply); start a new branch earlier "
            f"in the conversation or load the model with a larger context size"
        )


class UnsupportedRequest(ArborError):
    """A reply asks for something this model or llama.cpp cannot do (a JSON schema no grammar
    can express, a token id outside the vocabulary): the request's fault, nothing changed."""


class DecodeError(ArborError):
    """llama.cpp refused to decode a batch (for example, no room left in the cache)."""


class Cancelled(ArborError):
    """The operation was stopped by the user; the context was left consistent."""

    def __init__(self) -> None:
        super().__init__("stopped")


class EngineCrashed(ArborError):
    """The engine process ended in the middle of a request."""


class KernelsCrashed(EngineCrashed):
    """It faulted loading a model or on its first prompt: the next load goes without weight
    repacking (engine.llm.repack), so the request is worth one more try."""
