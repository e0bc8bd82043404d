"""The processor as llama.cpp's thread pool sees it: how many cores, and how many threads
Arbor uses by default."""

from __future__ import annotations

import os
from pathlib import Path


def logical_cores() -> int:
    """Logical processors this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def physical_cores(cpuinfo: str | None = None) -> int:
    """Physical cores (not hyper-threads) this process may use: from /proc/cpuinfo where it
    says (`cpuinfo` stands in for its text), the logical count otherwise."""
    logical = logical_cores()
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return logical
    cores: set[tuple[str, str]] = set()
    physical = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "physical id":
            physical = value
        elif key == "core id":
            cores.add((physical, value))
    return min(logical, len(cores)) if cores else logical
