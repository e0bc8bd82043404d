"""The conversation core: the tree, its records and the values one reply comes to.

Pure Python with no I/O and no native library: the tree and its nodes (tree, records), the
operations on a conversation (conversation), how a path becomes a prompt (prompt, templates),
what a reply finishes with (results), the decode schedule (schedule), what is left out when
the context is full (overflow), reasoning blocks, titles, errors and memory kinds. Every
other layer stands on this one; it imports none of them."""
