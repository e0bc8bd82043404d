"""Arbor's PySide6 desktop program. It talks to the engine through one worker thread."""
