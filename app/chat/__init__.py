"""The chat: the message list's model, view, painting and in-place editing, code blocks,
reasoning blocks, the version switcher and the composer."""
