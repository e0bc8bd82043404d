"""The processor as llama.cpp sees it: how many cores (and so how many threads Arbor uses by
default), its name and its feature flags."""

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
    cpuinfo = _cpuinfo() if cpuinfo is None else cpuinfo
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


def _cpuinfo() -> str:
    """/proc/cpuinfo's text (Linux); empty elsewhere."""
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _field(cpuinfo: str, *keys: str) -> str | None:
    """The first processor's value of the first of `keys` found."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return None


def cpu_name(cpuinfo: str | None = None) -> str:
    return _field(_cpuinfo() if cpuinfo is None else cpuinfo, "model name") or ""


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags as the kernel lists them (empty where it does not)."""
    found = _field(_cpuinfo() if cpuinfo is None else cpuinfo, "flags", "Features")
    return frozenset((found or "").split())


def has_amx(flags: frozenset[str]) -> bool:
    """Whether the CPU has AMX tiles (Sapphire Rapids and later Xeons)."""
    return bool(flags & {"amx_int8", "amx_tile"})
