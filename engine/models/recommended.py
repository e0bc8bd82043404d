"""The short list of recommended models (resources/recommended-models.json): what Discover
shows when its search box is empty, and without a network.

Kept as data so that it is edited without touching code. A size or sha256 the list does not
know is None: the hub says both at download time (engine.models.hub), and a known sha256 here
must then agree with the hub's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from engine.core.memory import MemoryKind
from engine.files.regular import FormatError, read_regular
from engine.models.quants import parse_gguf_name
from engine.models.remote import BadRepoNameError, check_repo_id

RECOMMENDED_FILE = Path(__file__).resolve().parents[2] / "resources" / "recommended-models.json"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Recommended:
    repo: str
    file: str
    title: str
    quant: str
    memory_kind: MemoryKind
    license: str
    approx_gb: float | None  # the publisher's rounded figure, for the list only
    size_bytes: int | None  # None: not verified
    sha256: str | None  # None: not verified

    @property
    def spec(self) -> str:
        """As `arbor-engine pull` takes it."""
        return f"{self.repo}:{self.quant}"


def load_recommended(path: Path = RECOMMENDED_FILE) -> list[Recommended]:
    """The list, checked; FormatError naming the first bad entry."""
    try:
        data = json.loads(read_regular(path, 1 << 20))
    except ValueError as exc:
        raise FormatError(f"{path.name} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("version") != 1:
        raise FormatError(f"{path.name}: not a version 1 list")
    out: list[Recommended] = []
    for i, item in enumerate(data.get("models") or []):
        try:
            out.append(_entry(item))
        except (KeyError, TypeError, ValueError, BadRepoNameError) as exc:
            raise FormatError(f"{path.name}: entry {i} is not valid ({exc})") from exc
    return out


def _entry(item: dict[str, object]) -> Recommended:
    repo = check_repo_id(str(item["repo"]))
    file = str(item["file"])
    name = parse_gguf_name(file)
    if name is None or name.quant is None:
        raise ValueError(f"{file} is not a GGUF file named with its quantization")
    quant = str(item["quant"])
    if quant.upper() != name.quant:
        raise ValueError(f"{file} is {name.quant}, not {quant}")
    size = item.get("size_bytes")
    sha = item.get("sha256")
    approx = item.get("approx_gb")
    if size is not None and not (isinstance(size, int) and size > 0):
        raise ValueError("size_bytes must be a positive integer or null")
    if sha is not None and not (isinstance(sha, str) and _HEX64.match(sha)):
        raise ValueError("sha256 must be 64 lowercase hex digits or null")
    if approx is not None and not isinstance(approx, int | float):
        raise ValueError("approx_gb must be a number or null")
    return Recommended(repo=repo, file=file, title=str(item["title"]), quant=quant,
                       memory_kind=MemoryKind(str(item["memory_kind"])),
                       license=str(item["license"]),
                       approx_gb=float(approx) if approx is not None else None,
                       size_bytes=size, sha256=sha)
