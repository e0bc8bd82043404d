"""What a user or a script chooses: the settings file (settings), the context and sampling
values (params), per-conversation overrides (overrides) and RPC worker addresses
(endpoints). Plain values, readable without llama.cpp."""
