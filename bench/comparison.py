"""Interleaved comparison of candidates against a floor measured in the same
run, and the table the bench scripts print.

The machine these run on is shared: other processes' fsyncs, CPU and
scheduling come and go in waves of seconds. So candidates are never timed one
after the other in long runs. Each *round* runs one short *block* of every
candidate (the order rotated from round to round, so none always goes first),
and a candidate's ratio is the median over rounds of (its block median / the
floor's block median in the same round): a wave of load hits both sides of
each ratio alike. The spread shown is the interquartile range of those
per-round ratios. Not a timed test: nothing here fails, it prints.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

BUSY_LOAD = 1.5
"""Load average above which the header warns that the numbers are noisy."""


@dataclass
class Candidate:
    name: str
    op: Callable[[], object]
    """One operation (one cycle); timed on its own."""
    target: float | None = None
    """Ratio to the floor this candidate must not exceed; None: shown for reference."""
    note: str = ""
    times: list[float] = field(default_factory=list)
    """Every operation's seconds."""
    cpu: list[float] = field(default_factory=list)
    """Every operation's CPU seconds in this process (all its threads): the
    client's share of the time; the rest is the server, the disk and waiting."""
    cpu_clock: Callable[[], float] = time.process_time
    """Reads the CPU seconds ``cpu`` counts (children's, for subprocesses)."""
    blocks: list[float] = field(default_factory=list)
    """Median seconds of each block, one per round."""
    cpu_blocks: list[float] = field(default_factory=list)
    """Median CPU seconds of each block, one per round."""

    @property
    def median(self) -> float:
        return statistics.median(self.times)


@dataclass
class Row:
    name: str
    median: float
    ratio: float | None
    low: float | None
    high: float | None
    target: float | None
    unit: str = "µs"
    note: str = ""
    cpu: float | None = None
    """Median CPU time of this process per operation, in ``unit``."""
    cpu_ratio: float | None = None
    """Like ``ratio``, of CPU times: less moved by other processes' load."""
    at_least: bool = False
    """The target is a floor for the ratio (throughput), not a ceiling (time)."""

    @property
    def met(self) -> str:
        if self.target is None or self.ratio is None:
            return ""
        ok = self.ratio >= self.target if self.at_least else self.ratio <= self.target
        return "yes" if ok else "NO"

    @property
    def target_text(self) -> str:
        if self.target is None:
            return "floor" if self.ratio == 1.0 and self.low is None else ""
        return f"{'>=' if self.at_least else '<='}{self.target:g}x"


BLOCK_SECONDS = 0.02
"""Length a block aims at: short, so the candidates of a round see the same
load, long enough to hold a few operations."""


def interleave(
    floor: Candidate,
    others: list[Candidate],
    *,
    per_block: int | None = None,
    min_rounds: int,
    budget: float,
    warmup: int = 3,
) -> int:
    """Run rounds of blocks until ``budget`` seconds have passed and at least
    ``min_rounds`` rounds are done. Returns the number of rounds. Without
    ``per_block``, each candidate's block holds about ``BLOCK_SECONDS`` of its
    operations (3 to 50), judged from its warm-up."""
    everyone = [floor, *others]
    sizes = {}
    for c in everyone:
        t0 = time.perf_counter()
        for _ in range(warmup):
            c.op()
        each = (time.perf_counter() - t0) / max(warmup, 1)
        sizes[id(c)] = per_block or max(3, min(50, int(BLOCK_SECONDS / max(each, 1e-9))))
    gc.collect()
    began = time.monotonic()
    rounds = 0
    while rounds < min_rounds or time.monotonic() - began < budget:
        shift = rounds % len(everyone)
        for c in everyone[shift:] + everyone[:shift]:
            block, used = [], []
            for _ in range(sizes[id(c)]):
                c0 = c.cpu_clock()
                t0 = time.perf_counter()
                c.op()
                block.append(time.perf_counter() - t0)
                used.append(c.cpu_clock() - c0)
            c.times.extend(block)
            c.cpu.extend(used)
            c.blocks.append(statistics.median(block))
            c.cpu_blocks.append(statistics.median(used))
        rounds += 1
    return rounds


def rows(
    floor: Candidate, others: list[Candidate], *, scale: float = 1e6, unit: str = "µs", cpu: bool = True
) -> list[Row]:
    def row(c: Candidate, ratio: float, low: float | None, high: float | None) -> Row:
        used = statistics.median(c.cpu) * scale if cpu else None
        cpu_ratios = [b / f for b, f in zip(c.cpu_blocks, floor.cpu_blocks, strict=True) if f > 0]
        cpu_ratio = statistics.median(cpu_ratios) if cpu and cpu_ratios else None
        return Row(c.name, c.median * scale, ratio, low, high, c.target, unit, c.note, used, cpu_ratio)

    out = [row(floor, 1.0, None, None)]
    for c in others:
        ratios = [b / f for b, f in zip(c.blocks, floor.blocks, strict=True)]
        out.append(row(c, statistics.median(ratios), *quartiles(ratios)))
    return out


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def print_table(title: str, table: list[Row]) -> None:
    width = max(len(r.name) for r in table)
    unit = table[0].unit
    cpu = any(r.cpu is not None for r in table)
    header = f"{'what':<{width}}  {'median ' + unit:>12}  " + (
        f"{'CPU ' + unit:>9}  {'CPU x':>5}  " if cpu else ""
    )
    header += f"{'ratio':>6}  {'spread (IQR)':>13}  {'target':>7}  met?"
    print(f"\n{title}")
    print(header)
    print("-" * len(header))
    for r in table:
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        spread = "" if r.low is None or r.high is None else f"{r.low:.2f}-{r.high:.2f}"
        used = ""
        if cpu:
            used = ("" if r.cpu is None else f"{r.cpu:.1f}").rjust(9) + "  "
            used += ("" if r.cpu_ratio is None else f"{r.cpu_ratio:.2f}").rjust(5) + "  "
        line = f"{r.name:<{width}}  {r.median:>12.1f}  {used}{ratio:>6}  {spread:>13}  "
        line += f"{r.target_text:>7}  {r.met}"
        print(line.rstrip() + (f"   ({r.note})" if r.note else ""))


def children_cpu() -> float:
    """CPU seconds of this process's finished children (a ``cpu_clock``)."""
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def load_average() -> float:
    return os.getloadavg()[0]


def source_state() -> str:
    """Which cronwarden is measured: its commit and whether its source differs
    from it, or its directory when it is not in a git checkout (e.g. a
    ``git archive`` snapshot put first on PYTHONPATH)."""
    import subprocess

    import cronwarden

    src = os.path.dirname(os.path.dirname(os.path.abspath(cronwarden.__file__)))

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=src, capture_output=True, text=True, timeout=10)
        return done.stdout if done.returncode == 0 else ""

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        dirty = git("status", "--porcelain", "--", ".").splitlines() if head else []
    except (OSError, subprocess.SubprocessError):
        head, dirty = "", []
    if not head:
        return f"cronwarden from {src}"
    changed = [line[3:] for line in dirty if line.strip() and not line.startswith("??")]
    return f"cronwarden at {head}" + (f" + uncommitted changes to {', '.join(changed)}" if changed else "")


def print_header(what: str) -> None:
    load = os.getloadavg()
    print(f"{what}\npython {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {source_state()}")  # fmt: skip
    if load[0] > BUSY_LOAD:
        print(f"warning: load average {load[0]:.2f} > {BUSY_LOAD}: the machine is busy, expect noisy numbers")


def print_footer(rounds: int, started: float) -> None:
    print(f"\n{rounds} interleaved rounds in {time.monotonic() - started:.1f} s; "
          f"load average now {load_average():.2f}")  # fmt: skip
