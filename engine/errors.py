"""Exceptions a user can cause. Each carries a message fit to show as it is.

Anything else that escapes the engine is a bug.
"""

from __future__ import annotations


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


class DecodeError(ArborError):
    """llama.cpp refused to decode a batch (for example, no room left in the cache)."""


class Cancelled(ArborError):
    """The operation was stopped by the user; the context was left consistent."""

    def __init__(self) -> None:
        super().__init__("stopped")
