"""Model files: finding, hashing and describing GGUF files (files) from their header alone
(gguf_header), without loading llama.cpp."""
