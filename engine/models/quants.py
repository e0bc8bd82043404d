"""A repository's GGUF files grouped by quantization, from their names.

Publishers name GGUF files after the quantization in a few styles that this reads:
`Model-Q4_K_M.gguf` (llama.cpp, bartowski), `Model.Q4_K_M.gguf` and `Model.i1-Q4_K_M.gguf`
(mradermacher), `model-q4_k_m.gguf` (lower case), Unsloth's dynamic `Model-UD-Q4_K_XL.gguf`,
importance quants `IQ2_XXS`..`IQ4_NL`, and split models `Model-Q8_0-00001-of-00003.gguf`,
often in a folder per quantization (`Q8_0/Model-Q8_0-00001-of-00003.gguf`). A split model is
one group of several files: llama.cpp loads it from its first part and finds the others next
to it, so a download takes every part. Vision projectors (`mmproj-*.gguf`) are no chat model
and are left out of the groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})$")
# One quantization name; the longest alternatives first so `Q4_K_M` is not read as `Q4_K`.
_QUANT = (
    r"(?:UD-)?(?:"
    r"IQ[1-4]_(?:XXS|XS|NL|S|M)|TQ[12]_0|MXFP4(?:_MOE)?|"
    r"Q[2-8]_K(?:_XXL|_XL|_S|_M|_L)?|Q4_0_[48]_[48]|Q[4-8]_[01]|Q[2-8]_K|"
    r"BF16|F16|FP16|F32|FP32)"
)
_QUANT_IN_NAME = re.compile(rf"(?:^|[-._])(?:i1-)?({_QUANT})(?=$|[-._])", re.IGNORECASE)
# The order `pick_default` tries when no quantization is named: llama.cpp's own default
# (`llama-server -hf repo` takes Q4_K_M), then its near neighbours.
DEFAULT_ORDER = ("Q4_K_M", "UD-Q4_K_XL", "Q4_K_S", "Q4_0", "Q5_K_M", "Q6_K", "Q8_0")


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository, as the hub lists it (size and sha256 when it says)."""

    path: str
    size: int | None = None
    sha256: str | None = None  # the LFS sha256 the hub records for the file's content


@dataclass(frozen=True)
class GGUFName:
    """What a GGUF file's name says."""

    stem: str  # the path without `.gguf` and without the split suffix: one per model
    quant: str | None  # upper case, `UD-` kept: "Q4_K_M", "UD-IQ1_S", "BF16"; None: unknown
    part: int  # 1-based; 1 for a single file
    parts: int  # 1 for a single file


@dataclass(frozen=True)
class QuantGroup:
    """One downloadable model: a quantization's file, or all the parts of a split one."""

    quant: str  # the quantization's name, or the file's stem when its name has none
    files: tuple[RepoFile, ...]  # in part order
    parts: int  # how many parts the names announce (== len(files) when complete)

    @property
    def size(self) -> int | None:
        """All parts' bytes together; None when the hub did not say for one of them."""
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s)

    @property
    def complete(self) -> bool:
        return len(self.files) == self.parts

    @property
    def first(self) -> RepoFile:
        """The file llama.cpp loads (a split model's first part)."""
        return self.files[0]


def parse_gguf_name(path: str) -> GGUFName | None:
    """The quantization and split part of a `.gguf` file name; None for other files."""
    pure = PurePosixPath(path)
    if pure.suffix.lower() != ".gguf":
        return None
    stem = str(pure.with_suffix(""))
    part, parts = 1, 1
    split = _SPLIT.search(stem)
    if split:
        part, parts = int(split.group(1)), int(split.group(2))
        stem = stem[: split.start()]
        if not 1 <= part <= parts:
            return None
    found = _QUANT_IN_NAME.findall(PurePosixPath(stem).name)
    quant = found[-1].upper() if found else None
    return GGUFName(stem=stem, quant=quant, part=part, parts=parts)


def is_projector(path: str) -> bool:
    """A multimodal projector (`mmproj-*.gguf`): loaded beside a model, never on its own."""
    return PurePosixPath(path).name.lower().startswith("mmproj")


def group_files(files: list[RepoFile]) -> list[QuantGroup]:
    """A repository's GGUF files as models, one group per quantization (a split model's parts
    together), smallest first (unknown sizes last)."""
    groups: dict[str, list[tuple[int, RepoFile]]] = {}
    info: dict[str, GGUFName] = {}
    for f in files:
        name = parse_gguf_name(f.path)
        if name is None or is_projector(f.path):
            continue
        key = f"{name.stem}|{name.parts}"
        groups.setdefault(key, []).append((name.part, f))
        info[key] = name
    out: list[QuantGroup] = []
    for key, members in groups.items():
        name = info[key]
        members.sort(key=lambda m: m[0])
        unique = {part: f for part, f in members}
        out.append(QuantGroup(
            quant=name.quant or PurePosixPath(name.stem).name,
            files=tuple(unique[p] for p in sorted(unique)),
            parts=name.parts,
        ))
    out.sort(key=lambda g: (g.size is None, g.size or 0, g.quant))
    return out


def pick_group(groups: list[QuantGroup], quant: str | None) -> QuantGroup | None:
    """The group named `quant` (case-insensitive; `Q4_K_XL` also finds `UD-Q4_K_XL`), or
    the default quantization when `quant` is None. None when nothing matches or the name is
    ambiguous (two models of the repository in that quantization)."""
    complete = [g for g in groups if g.complete]
    if quant is None:
        for wanted in DEFAULT_ORDER:
            found = [g for g in complete if g.quant == wanted]
            if len(found) == 1:
                return found[0]
        return complete[0] if len(complete) == 1 else None
    wanted = quant.upper()
    exact = [g for g in complete if g.quant.upper() == wanted]
    if not exact:
        exact = [g for g in complete if g.quant.upper().removeprefix("UD-") == wanted]
    return exact[0] if len(exact) == 1 else None
