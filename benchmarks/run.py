"""Run the benchmark suite: ``python benchmarks/run.py [--quick] [--filter SUBSTR] [--write PATH]``.

Finds ``benchmarks/bench_*.py`` (each exposes ``cases()`` and optionally ``targets()``, see
``_harness.py``), times every case in ns per call and prints one table per group; ``--write``
also writes the Markdown report (``make bench`` writes ``docs/benchmarks.md``).

Method, chosen for small noisy shared machines where absolute numbers drift by tens of percent
from one minute to the next:

* every case is checked once (a rejection case must really be rejected), then its loop count
  is calibrated so one sample lasts about ``--sample-ms``;
* the cases of a group are then measured in *rounds*: each round takes one sample of every case,
  in a fresh random order, so drift hits all cases of a round alike;
* a case's figure is the median over rounds of its ns per call; a ratio is the median over
  rounds of the per-round ratio (both samples of a round were taken within a fraction of a
  second of each other), which cancels most of the drift;
* the garbage collector is off while a sample runs and collects between rounds (as ``timeit``);
* async cases run inside one event loop per group (``asyncio.run`` once per group), which gets
  a turn (``await asyncio.sleep(0)``, untimed) between samples and every ``ASYNC_CHUNK`` calls.

The exit status is 1 when a case failed its check or raised while measured, else 0: targets are
reported, never enforced (on a noisy machine a close call could flip either way).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import importlib
import importlib.metadata
import os
import platform
import random
import shlex
import statistics
import sys
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _harness import AsyncLoop, Case, SyncLoop, Target  # noqa: E402

T = TypeVar("T")

PACKAGES = (
    "floodwall",
    "pybreaker",
    "circuitbreaker",
    "aiobreaker",
    "purgatory",
    "hyx",
    "tenacity",
    "stamina",
    "backoff",
    "limits",
    "pyrate-limiter",
    "throttled-py",
    "aiolimiter",
)
"""Distributions whose versions the report lists."""

FULL_ROUNDS, FULL_SAMPLE_MS = 25, 30.0
QUICK_ROUNDS, QUICK_SAMPLE_MS = 3, 5.0
ASYNC_CHUNK = 100
"""Async calls per timed stretch; the event loop runs between stretches."""

HEADER = """\
# Benchmarks

Side-by-side cost of floodwall's hot paths and of the peer libraries doing the same job, in
nanoseconds per call, written by `make bench`. **Only the ratios within one run mean
anything.** These numbers come from small shared 2-core machines whose speed drifts by tens of
percent from one minute to the next: absolute figures are not comparable across runs or
machines. Every ratio compares two cases measured side by side in the same rounds (interleaved,
random order per round) and is the median of the per-round ratios, which cancels most of that
drift.

Run it with `make bench` (the command below; it rewrites this file), or
`.venv/bin/python benchmarks/run.py` to print the tables without writing. `--quick` takes fewer
and shorter samples (a smoke run, seconds), `--filter SUBSTR` keeps the groups or cases whose
name contains SUBSTR (a group's reference cases are always kept). The cases live in
`benchmarks/bench_*.py`; `bench_core.py` times each shortcut of the drivers and the core on and
off. `benchmarks/versus.py` times the breaker success path of this tree beside an older
revision's (two worker processes, interleaved rounds).
"""


@dataclass
class Measured:
    """A case's samples (ns per call, one per round, in round order) or why it has none."""

    case: Case
    per_call: list[float] = field(default_factory=list)
    n: int = 0
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.per_call)


@dataclass
class GroupResult:
    name: str
    cases: list[Case]
    measured: dict[str, Measured]

    def refs(self) -> list[Case]:
        return [c for c in self.cases if c.ref is not None]

    def ratios(self, label: str, ref_label: str) -> list[float] | None:
        """Per-round ratios ``label / ref_label``, or None when either has no samples."""
        a, b = self.measured.get(label), self.measured.get(ref_label)
        if a is None or b is None or not a.per_call or not b.per_call:
            return None
        return [x / y for x, y in zip(a.per_call, b.per_call, strict=True)]


# -- measuring ---------------------------------------------------------------------------------


async def _sample(sync: SyncLoop | None, aloop: AsyncLoop | None, n: int) -> int:
    """Nanoseconds taken by ``run(n)``, garbage collector off.

    An async loop runs in chunks of at most ``ASYNC_CHUNK`` calls, and the event loop gets a turn
    (untimed) between chunks, as it would between real calls that suspend: otherwise a loop that
    never yields piles up every cancelled timer handle of ``asyncio.timeout`` in the loop's heap
    (it is only purged when the loop runs), which slows the heap pushes it measures.
    """
    gc.disable()
    try:
        if aloop is None:
            assert sync is not None
            t0 = time.perf_counter_ns()
            sync(n)
            return time.perf_counter_ns() - t0
        took = 0
        while n > 0:
            chunk = min(n, ASYNC_CHUNK)
            await asyncio.sleep(0)  # the loop's turn, untimed
            t0 = time.perf_counter_ns()
            await aloop(chunk)
            took += time.perf_counter_ns() - t0
            n -= chunk
        return took
    finally:
        gc.enable()


async def _check(case: Case) -> None:
    """Run the body once: it must complete, or raise exactly ``case.raises``."""
    if case.fn is not None or case.afn is not None:
        try:
            if case.fn is not None:
                case.fn()
            else:
                assert case.afn is not None
                await case.afn()
        except BaseException as exc:
            if case.raises is not None and isinstance(exc, case.raises):
                return
            raise
        if case.raises is not None:
            raise AssertionError(f"expected {case.raises.__name__}, the call returned")
    elif case.loop is not None:
        case.loop(1)
    else:
        assert case.aloop is not None
        await case.aloop(1)


async def _calibrate(sync: SyncLoop | None, aloop: AsyncLoop | None, sample_ns: float) -> int:
    """A loop count for which one sample lasts about ``sample_ns``."""
    n = 1
    while True:
        took = await _sample(sync, aloop, n)
        if took >= sample_ns / 8 or n >= 1 << 30:
            break
        n *= 10 if took < sample_ns / 500 else 2
    return max(1, round(n * sample_ns / max(took, 1)))


async def _measure_group(
    cases: Sequence[Case], rounds: int, sample_ns: float, rng: random.Random, progress: str
) -> dict[str, Measured]:
    is_async = any(c.is_async for c in cases)
    measured = {c.label: Measured(c) for c in cases}
    loops: dict[str, tuple[SyncLoop | None, AsyncLoop | None]] = {}
    for case in cases:
        m = measured[case.label]
        if case.skip is not None:
            continue
        loop_pair: tuple[SyncLoop | None, AsyncLoop | None] = (
            (None, case.async_loop()) if case.is_async else (case.sync_loop(), None)
        )
        try:
            await _check(case)
            if case.before is not None:
                case.before()
            m.n = await _calibrate(*loop_pair, sample_ns)
        except Exception as exc:
            m.error = f"{type(exc).__name__}: {exc}"
            continue
        loops[case.label] = loop_pair
    for r in range(rounds):
        _status(f"{progress}: round {r + 1}/{rounds}")
        order = [c for c in cases if c.label in loops]
        rng.shuffle(order)
        gc.collect()
        for case in order:
            m = measured[case.label]
            if case.before is not None:
                case.before()
            if is_async:
                await asyncio.sleep(0)  # let the loop run its housekeeping outside the timer
            try:
                took = await _sample(*loops[case.label], m.n)
            except Exception as exc:
                m.error = f"{type(exc).__name__} while measured: {exc}"
                del loops[case.label]
                continue
            m.per_call.append(took / m.n)
    for m in measured.values():
        if m.error is not None:
            m.per_call.clear()
    return measured


def _run_without_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine that never suspends (a group of sync cases) without an event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        result: T = stop.value
        return result
    coro.close()
    raise RuntimeError("a sync benchmark group tried to suspend")


def _loop_overhead(sample_ns: float) -> float:
    """ns per iteration of an empty ``for _ in repeat(None, n): pass``, included in every figure."""

    def empty(n: int) -> None:
        for _ in repeat(None, n):
            pass

    n = _run_without_loop(_calibrate(empty, None, sample_ns))
    return min(_run_without_loop(_sample(empty, None, n)) / n for _ in range(5))


def _status(text: str) -> None:
    if sys.stderr.isatty():
        print(f"\r\x1b[K{text}", end="", file=sys.stderr, flush=True)


# -- discovering -------------------------------------------------------------------------------


def _modules() -> list[ModuleType]:
    return [importlib.import_module(p.stem) for p in sorted(HERE.glob("bench_*.py"))]


def _select(cases: list[Case], pattern: str | None) -> list[Case]:
    """Cases whose group or label contains ``pattern``, plus their groups' references."""
    if not pattern:
        return cases
    p = pattern.lower()
    hit_groups = {c.group for c in cases if p in c.group.lower() or p in c.label.lower()}
    return [
        c
        for c in cases
        if p in c.group.lower()
        or p in c.label.lower()
        or (c.ref is not None and c.group in hit_groups)
    ]


def _by_group(cases: list[Case]) -> dict[str, list[Case]]:
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.group, []).append(case)
    for name, members in groups.items():
        labels = [c.label for c in members]
        if len(set(labels)) != len(labels):
            raise ValueError(f"group {name!r} has duplicate case labels: {labels}")
    return groups


# -- reporting ---------------------------------------------------------------------------------


def _ns(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _ratio(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _group_table(g: GroupResult) -> list[str]:
    refs = g.refs()
    head = ["case", "ns/call", "±", "min", *(f"× {r.ref}" for r in refs)]
    lines = [_row(head), _row(["---", *["---:"] * (len(head) - 1)])]
    notes: list[str] = []
    for case in g.cases:
        m = g.measured[case.label]
        label = f"**{case.label}**" if case.label.startswith("floodwall") else case.label
        if case.skip is not None or m.error is not None or not m.per_call:
            why = case.skip or m.error or "not measured"
            lines.append(
                _row([label, "skipped" if case.skip else "error", "", "", *[""] * len(refs)])
            )
            notes.append(f"- *{case.label}*: {why}")
            continue
        q1, q3 = _quartiles(m.per_call)
        spread = f"{50 * (q3 - q1) / m.median:.0f}%"
        cells = [label, _ns(m.median), spread, _ns(min(m.per_call))]
        for ref in refs:
            ratios = g.ratios(case.label, ref.label)
            cells.append("" if ratios is None else _ratio(statistics.median(ratios)))
        lines.append(_row(cells))
        if case.note:
            notes.append(f"- *{case.label}*: {case.note}")
    if notes:
        lines += ["", *notes]
    return lines


def _target_lines(targets: list[Target], results: dict[str, GroupResult]) -> list[str]:
    lines = [
        _row(["target", "measured", "per-round range (p25–p75)", "limit", "result"]),
        _row(["---", "---:", "---:", "---:", "---"]),
    ]
    for t in targets:
        g = results.get(t.group)
        ratios = None if g is None else g.ratios(t.case, t.ref)
        limit = "—" if t.max_ratio is None else f"≤ {t.max_ratio:g}"
        if ratios is None:
            lines.append(_row([t.text, "not measured", "", limit, "—"]))
            continue
        med = statistics.median(ratios)
        q1, q3 = _quartiles(ratios)
        verdict = (
            "info" if t.max_ratio is None else ("**PASS**" if med <= t.max_ratio else "**FAIL**")
        )
        lines.append(_row([t.text, f"{med:.2f} ×", f"{q1:.2f}–{q3:.2f}", limit, verdict]))
    return lines


def _command() -> str:
    exe = Path(sys.executable)
    try:
        shown = os.path.relpath(exe)
    except ValueError:
        shown = str(exe)
    python = shown if not shown.startswith("..") else "python"
    return shlex.join([python, *sys.argv])


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.processor() or "unknown"
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _versions() -> str:
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def _environment(rounds: int, sample_ms: float, overhead: float, took: float) -> list[str]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    impl = platform.python_implementation()
    return [
        f"- Command: `{_command()}`",
        f"- Date: {now}; the run took {took:.0f} s",
        f"- Python: {platform.python_version()} ({impl}) on {platform.platform()}",
        f"- CPUs: {os.cpu_count()} ({usable} usable by this process), {_cpu_model()}",
        f"- Packages: {_versions()}",
        f"- Method: {rounds} rounds of one ~{sample_ms:g} ms sample per case, cases in random "
        "order in every round, garbage collector off during samples. `ns/call` is the median "
        "over rounds, `±` half the interquartile range relative to it, `min` the fastest "
        "round; `× X` is the median over rounds of this case's time divided by X's in the "
        f"same round. Async cases are timed in stretches of {ASYNC_CHUNK} calls, the event "
        "loop running (untimed) in between, as it would between real calls that suspend.",
        f"- Every figure includes the loop's own bookkeeping, {overhead:.1f} ns per iteration "
        "here (an empty `for _ in repeat(None, n): pass`).",
    ]


def _report(
    results: dict[str, GroupResult],
    targets: list[Target],
    environment: list[str],
) -> str:
    lines = [HEADER, "## This run", "", *environment, ""]
    shown_targets = [t for t in targets if t.group in results]
    if shown_targets:
        lines += ["## Targets", "", *_target_lines(shown_targets, results), ""]
    for g in results.values():
        lines += [f"## {g.name}", "", *_group_table(g), ""]
    return "\n".join(lines).rstrip() + "\n"


# -- main --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--write", metavar="PATH", type=Path, help="write the Markdown report")
    parser.add_argument("--quick", action="store_true", help="few short samples (smoke run)")
    parser.add_argument("--filter", metavar="SUBSTR", help="groups or cases containing SUBSTR")
    parser.add_argument("--rounds", type=int, help="rounds per group (default 25, quick 3)")
    parser.add_argument("--sample-ms", type=float, help="ms per sample (default 30, quick 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the round orders")
    args = parser.parse_args(argv)

    rounds: int = args.rounds or (QUICK_ROUNDS if args.quick else FULL_ROUNDS)
    sample_ms: float = args.sample_ms or (QUICK_SAMPLE_MS if args.quick else FULL_SAMPLE_MS)
    sample_ns = sample_ms * 1e6
    rng = random.Random(args.seed)
    started = time.perf_counter()

    all_cases: list[Case] = []
    targets: list[Target] = []
    for module in _modules():
        all_cases += module.cases()
        targets += getattr(module, "targets", list)()
    groups = _by_group(_select(all_cases, args.filter))
    if not groups:
        print(f"no benchmark matches --filter {args.filter!r}", file=sys.stderr)
        return 2

    results: dict[str, GroupResult] = {}
    for i, (name, cases) in enumerate(groups.items(), 1):
        progress = f"[{i}/{len(groups)}] {name}"
        _status(progress)
        job = _measure_group(cases, rounds, sample_ns, rng, progress)
        is_async = any(c.is_async for c in cases)
        measured = asyncio.run(job) if is_async else _run_without_loop(job)
        results[name] = GroupResult(name, cases, measured)
    _status("")
    overhead = _loop_overhead(sample_ns)
    took = time.perf_counter() - started

    report = _report(results, targets, _environment(rounds, sample_ms, overhead, took))
    print(report.split("## This run", 1)[1].split("\n", 1)[1].lstrip("\n"), end="")
    if args.write is not None:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(report, encoding="utf-8")
        print(f"\nwrote {args.write}")
    failed = [m for g in results.values() for m in g.measured.values() if m.error is not None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
