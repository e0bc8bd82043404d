"""Models named as people know them: "SmolLM2 135M Instruct · Q4_1", not the header's raw
`general.name` ("Smollm2 135M 8k Lc100K Mix1 Ep2").

Publishers name GGUF files after the model's family, size and variant, then the quantization
(`SmolLM2-135M-Instruct.Q4_1.gguf`, `gemma-3-1b-it-Q4_K_M.gguf`, `Qwen3-1.7B-Q8_0.gguf`): the
file name is what the model's page, the hub and other apps call it, so the name is made from it
(engine.models.quants parses the quantization and a split model's part), with sizes in upper
case and all-lower-case words capitalised. The header's name is the fallback for a file whose
name says nothing.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from engine.models.quants import parse_gguf_name

SEPARATOR = " · "
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmbt])$", re.IGNORECASE)  # 135m, 1.7b, 8x7b's parts
_MOE = re.compile(r"^(\d+)x(\d+(?:\.\d+)?)([kmbt])$", re.IGNORECASE)
# Words with a spelling of their own (lower-case forms in file names).
_KNOWN = {"it": "IT", "gguf": "", "hf": "", "instruct": "Instruct", "chat": "Chat",
          "moe": "MoE", "vl": "VL", "qat": "QAT", "ud": "UD", "smollm2": "SmolLM2",
          "smollm3": "SmolLM3", "lfm2": "LFM2", "rwkv7": "RWKV7", "gpt": "GPT", "oss": "OSS"}


def display_name(file_name: str, header_name: str | None = None) -> str:
    """"Family Size Variant · QUANT" from a GGUF file's name (a path is fine)."""
    parsed = parse_gguf_name(PurePosixPath(file_name).name)
    if parsed is None:
        return header_name or PurePosixPath(file_name).name
    stem = PurePosixPath(parsed.stem).name
    if parsed.quant is not None:
        stem = _without_quant(stem, parsed.quant)
    words = [_word(w) for w in _split(stem)]
    title = " ".join(w for w in words if w)
    if not title:
        title = header_name or stem
    return f"{title}{SEPARATOR}{parsed.quant}" if parsed.quant else title


def _without_quant(stem: str, quant: str) -> str:
    """The stem with its last mention of the quantization (and an `i1-` before it) cut."""
    lower, wanted = stem.lower(), quant.lower()
    at = lower.rfind(wanted)
    if at < 0:
        return stem
    head = stem[:at]
    if head.lower().endswith("i1-"):
        head = head[:-3]
    return (head + stem[at + len(quant):]).strip("-._ ")


def _split(stem: str) -> list[str]:
    """Words between `-`, `_`, spaces and dots, keeping a version's dot (`3.2`, `1.7B`)."""
    return [w for w in re.split(r"[-_\s]+|(?<!\d)\.|\.(?!\d)", stem) if w]


def _word(word: str) -> str:
    low = word.lower()
    if low in _KNOWN:
        return _KNOWN[low]
    size = _SIZE.match(word)
    if size:
        return size.group(1) + size.group(2).upper()
    if re.match(r"^v\d", low):  # a version: v0.1
        return low
    moe = _MOE.match(word)
    if moe:
        return f"{moe.group(1)}x{moe.group(2)}{moe.group(3).upper()}"
    if word.islower() and word.isalpha():
        return word.capitalize()
    if word.islower() and word[0].isalpha():  # qwen3, granite4
        return word[0].upper() + word[1:]
    return word
