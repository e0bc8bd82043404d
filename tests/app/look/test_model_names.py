"""Models named as people know them, from the names publishers give their GGUF files."""

from __future__ import annotations

import pytest

from app.look.model_names import display_name


@pytest.mark.parametrize(("file", "shown"), [
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2 135M Instruct · Q4_1"),
    ("gemma-3-1b-it-Q4_K_M.gguf", "Gemma 3 1B IT · Q4_K_M"),
    ("Qwen3-1.7B-Q8_0.gguf", "Qwen3 1.7B · Q8_0"),
    ("Llama-3.2-3B-Instruct-Q4_K_M.gguf", "Llama 3.2 3B Instruct · Q4_K_M"),
    ("granite-4.0-h-micro-Q4_K_M.gguf", "Granite 4.0 H Micro · Q4_K_M"),
    ("rwkv7-2.9B-world-q4_k_m.gguf", "RWKV7 2.9B World · Q4_K_M"),
    ("Qwen3-30B-A3B-UD-Q4_K_XL.gguf", "Qwen3 30B A3B · UD-Q4_K_XL"),
    ("mixtral-8x7b-v0.1.Q4_0.gguf", "Mixtral 8x7B v0.1 · Q4_0"),
    ("Model.i1-IQ2_XXS.gguf", "Model · IQ2_XXS"),
    ("Q8_0/Big-Model-Q8_0-00001-of-00003.gguf", "Big Model · Q8_0"),
    ("tiny-dense.gguf", "Tiny Dense"),
])
def test_a_file_name_becomes_family_size_variant_and_quant(file: str, shown: str) -> None:
    assert display_name(file, "Raw General Name") == shown


def test_a_name_that_says_nothing_falls_back_to_the_header() -> None:
    assert display_name("Q4_K_M.gguf", "Smollm2 135M") == "Smollm2 135M · Q4_K_M"
    assert display_name("notes.txt", "Header") == "Header"
