"""Arbor's engine: the conversation tree, the llama.cpp runtime, prompts and replay.

Never imports Qt or `app`: everything here works headless.
"""

__version__ = "0.1.0"
