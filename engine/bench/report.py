"""The benchmark's outputs: every raw figure as JSON, Markdown tables, PNG plots.

Raw records are one measured reply each: model, system, length, round, case, time to first
token, tokens decoded, the text, and whether the text equals the full reprocess's text in the
same round. Summaries never drop a record: a system whose text differs is flagged.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.bench.cases import TARGET_CASES, TARGET_SLACK, TARGET_SPEEDUP, Case
from engine.bench.stats import Spread, ratios, speedups

log = logging.getLogger(__name__)

REFERENCE = "reprocess"
ARBOR = "arbor"
PLAIN = "plain"


@dataclass(frozen=True)
class Record:
    model: str
    system: str
    length: int  # nominal conversation length (tokens)
    round: int
    case: str
    ttft_ms: float
    decoded: int
    text: str
    prompt_tokens: int | None = None
    same_text: bool | None = None  # equals the full reprocess of the same round
    new_tokens: int | None = None  # the case's new message in tokens, for the decode target


def mark_same_text(records: list[Record]) -> list[Record]:
    """Each record with `same_text` set against the full reprocess of its round."""
    reference = {(r.model, r.length, r.round, r.case): r.text
                 for r in records if r.system == REFERENCE}
    out = []
    for r in records:
        ref = reference.get((r.model, r.length, r.round, r.case))
        same = None if ref is None else r.text == ref
        out.append(Record(**{**asdict(r), "same_text": same}))
    return out


Key = tuple[str, int, str, str]  # model, length, case, system


def group(records: Iterable[Record]) -> dict[Key, list[Record]]:
    """Records by model, length, case and system, in round order."""
    groups: dict[Key, list[Record]] = defaultdict(list)
    for r in records:
        groups[(r.model, r.length, r.case, r.system)].append(r)
    for rows in groups.values():
        rows.sort(key=lambda r: r.round)
    return groups


@dataclass(frozen=True)
class Cell:
    """One system's summary in one model, length and case."""

    ttft: Spread  # ms
    decoded: Spread
    ratio: Spread | None  # TTFT over the full reprocess's of the same round
    differs: int  # rounds whose text differs from the full reprocess
    rounds: int


def summarise(records: Sequence[Record]) -> dict[Key, Cell]:
    groups = group(records)
    cells: dict[Key, Cell] = {}
    for (model, length, case, system), rows in groups.items():
        ref = {r.round: r for r in groups.get((model, length, case, REFERENCE), [])}
        paired = [r for r in rows if r.round in ref]
        ratio = Spread.of(ratios([r.ttft_ms for r in paired],
                                 [ref[r.round].ttft_ms for r in paired])) if paired else None
        cells[(model, length, case, system)] = Cell(
            ttft=Spread.of([r.ttft_ms for r in rows]),
            decoded=Spread.of([float(r.decoded) for r in rows]),
            ratio=ratio,
            differs=sum(1 for r in rows if r.same_text is False),
            rounds=len(rows),
        )
    return cells


@dataclass(frozen=True)
class Verdict:
    model: str
    case: str
    decoded: float  # Arbor's median
    allowed: int  # the new message plus the slack
    decode_met: bool
    speedup: Spread | None  # plain TTFT over Arbor's, round by round, at the longest length
    speed_met: bool | None  # None where no speed target applies (the dense model)


def targets(records: Sequence[Record], *, speed_kinds: dict[str, bool]) -> list[Verdict]:
    """The issue's targets at the longest length measured: after a switch back, an early edit
    or a regenerate, Arbor decodes at most the new message plus TARGET_SLACK tokens; and (for
    the models where `speed_kinds` says so) its TTFT is TARGET_SPEEDUP times the plain app's."""
    groups = group(records)
    out = []
    for model in dict.fromkeys(r.model for r in records):
        lengths = [r.length for r in records if r.model == model]
        longest = max(lengths)
        for case in TARGET_CASES:
            arbor = groups.get((model, longest, case.value, ARBOR), [])
            if not arbor:
                continue
            decoded = Spread.of([float(r.decoded) for r in arbor]).median
            allowed = (arbor[0].new_tokens or 0) + TARGET_SLACK
            plain = {r.round: r for r in groups.get((model, longest, case.value, PLAIN), [])}
            paired = [r for r in arbor if r.round in plain]
            speed = Spread.of(speedups([plain[r.round].ttft_ms for r in paired],
                                       [r.ttft_ms for r in paired])) if paired else None
            applies = speed_kinds.get(model, False)
            out.append(Verdict(
                model, case.value, decoded, allowed, decoded <= allowed, speed,
                (speed.median >= TARGET_SPEEDUP if speed is not None else False)
                if applies else None,
            ))
    return out


# --- writing -----------------------------------------------------------------------------


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, default=_json_default) + "\n", encoding="utf-8")


def _json_default(value: object) -> object:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)  # type: ignore[call-overload]
    return str(value)


def _seconds(spread: Spread) -> str:
    return f"{spread.median / 1000:.2f} s" + (
        f" ({spread.low / 1000:.2f}-{spread.high / 1000:.2f})"
        if spread.n > 1 and spread.high > spread.low else "")


def _cell_text(cell: Cell | None, *, decoded: bool = True) -> str:
    if cell is None:
        return "—"
    parts = []
    if decoded:
        parts.append(f"{cell.decoded.median:.0f} tok")
    parts.append(_seconds(cell.ttft))
    if cell.ratio is not None:
        parts.append(f"x{cell.ratio.median:.3f}")
    text = " / ".join(parts)
    if cell.differs:
        text += f" **≠ text differs in {cell.differs}/{cell.rounds}**"
    return text


def table(records: Sequence[Record], systems: Sequence[str], titles: dict[str, str],
          *, lengths: Sequence[int] | None = None) -> str:
    """One row per model, length and case; per system the median tokens decoded, the median
    TTFT (with its range over the rounds) and the median same-round ratio to the full
    reprocess. A text that differs from the full reprocess's is flagged in its cell."""
    cells = summarise(records)
    models = list(dict.fromkeys(r.model for r in records))
    shown = sorted({r.length for r in records} if lengths is None else set(lengths))
    head = "| model | tokens | case | " + " | ".join(titles.get(s, s) for s in systems) + " |"
    lines = [head, "|" + "---|" * (3 + len(systems))]
    for model in models:
        for length in shown:
            for case in Case:
                row = [cells.get((model, length, case.value, s)) for s in systems]
                if all(c is None for c in row):
                    continue
                prompt = _prompt_tokens(records, model, length, case.value)
                lines.append(f"| {model} | {prompt or length} | {case.label} | "
                             + " | ".join(_cell_text(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def _prompt_tokens(records: Sequence[Record], model: str, length: int, case: str) -> int | None:
    values = [r.prompt_tokens for r in records if r.model == model and r.length == length
              and r.case == case and r.system == REFERENCE and r.prompt_tokens]
    return int(Spread.of([float(v) for v in values]).median) if values else None


def targets_table(verdicts: Sequence[Verdict]) -> str:
    lines = ["| model | case | Arbor decoded (median) | allowed (new message + "
             f"{TARGET_SLACK}) | plain app TTFT / Arbor TTFT | target x{TARGET_SPEEDUP:.0f} |",
             "|---|---|---|---|---|---|"]
    for v in verdicts:
        speed = f"x{v.speedup.median:.1f}" if v.speedup is not None else "—"
        met = "n/a" if v.speed_met is None else ("met" if v.speed_met else "**missed**")
        decoded = f"{v.decoded:.0f}" + ("" if v.decode_met else " **missed**")
        lines.append(f"| {v.model} | {Case(v.case).label} | {decoded} | {v.allowed} | "
                     f"{speed} | {met} |")
    return "\n".join(lines) + "\n"


def plots(records: Sequence[Record], systems: Sequence[str], titles: dict[str, str],
          out_dir: Path) -> list[Path]:
    """One PNG per case: median TTFT against conversation length, a panel per model, a line
    per system. Empty (with a log line) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plots (pip install matplotlib)")
        return []
    cells = summarise(records)
    models = list(dict.fromkeys(r.model for r in records))
    lengths = sorted({r.length for r in records})
    written: list[Path] = []
    if not models:  # the API session alone (--lengths ""): nothing to plot
        return written
    for case in Case:
        fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6),
                                 squeeze=False)
        for ax, model in zip(axes[0], models, strict=True):
            for system in systems:
                points = [(n, cells[(model, n, case.value, system)].ttft.median / 1000)
                          for n in lengths if (model, n, case.value, system) in cells]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, marker="o", label=titles.get(system, system))
            ax.set_title(model, fontsize=9)
            ax.set_xlabel("conversation (tokens)")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].set_ylabel("time to first token (s)")
        axes[0][-1].legend(fontsize=7)
        fig.suptitle(case.label, fontsize=11)
        fig.tight_layout()
        path = out_dir / f"ttft-{case.value}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
