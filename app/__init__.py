"""Arbor's PySide6 desktop program, a front end of the engine: the engine runs in its own
process, and the window talks to it through the engine client (app.state).

Layers, bottom to top: look (theme, icons, actions), state (the open conversations and the
engine's side, Qt objects without widgets), chat, tree and dialogs (widgets), window."""
