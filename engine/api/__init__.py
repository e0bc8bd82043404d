"""The local OpenAI-compatible server: one more front end of the same operations and engine.

`schema` reads and checks a request and shapes the answers; `trees` turns a message list into
a path in a conversation tree; `worker` runs replies one at a time on the engine; `server` is
the HTTP side (Starlette and uvicorn). Nothing here imports Qt or llama.cpp.
"""
