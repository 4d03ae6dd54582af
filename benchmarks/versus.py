"""The breaker's success path in this tree beside an older revision, timed in one interleaved run.

``python benchmarks/versus.py [--rev f9b4933] [--rounds 41] [--sample-ms 30]``

Two Python packages named ``floodwall`` cannot share one process, so each tree gets a worker
process (the same interpreter, the tree's ``src`` first on ``sys.path``): this checkout's and the
older revision's, unpacked by ``git archive REV src`` into a temporary folder (never committed,
removed at the end). The parent process asks the workers in turn: in every round each case of
each tree takes one sample, in a fresh random order, while the other worker waits on its pipe,
so the machine's drift hits both trees alike; both workers are pinned to one CPU (``--cpu``),
so a round never compares two cores under different loads. A figure is the median over rounds
(ns per call); the difference and the ratio are the medians of the per-round differences and
ratios. The fastest round of each (``min``) is printed too: on a machine busy with other work it
is the sample least disturbed, and the difference of the two minimums the steadiest figure.

Cases (the protected function is ``return 1``): ``@CircuitBreaker`` (the row of
``docs/benchmarks.md`` that issue 16's "+100 ns" bar refers to), ``breaker.call(f)``, their
async twins, ``Timeout(1.0).call_async`` and ``asyncio.timeout`` (the same code in both trees,
a yardstick of the machine's state). The load average is printed before and after: quote it
with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = (
    "@CircuitBreaker",
    "breaker.call(f)",
    "@CircuitBreaker (async def)",
    "breaker.call_async",
    "timeout.call_async",
    "async with asyncio.timeout",
)
BAR_CASE = "@CircuitBreaker"
BAR_NS = 100.0
"""Issue 16: the success path may cost at most this much more than the old revision's."""

WORKER = r"""
import asyncio, gc, json, sys, time
from itertools import repeat

sys.path.insert(0, sys.argv[1])
import floodwall

def f():
    return 1

async def af():
    return 1

deco = floodwall.CircuitBreaker("versus-deco")(f)
explicit = floodwall.CircuitBreaker("versus-call")
adeco = floodwall.CircuitBreaker("versus-adeco")(af)
aexplicit = floodwall.CircuitBreaker("versus-acall")

def sync_deco(n):
    for _ in repeat(None, n):
        deco()

def sync_call(n):
    call = explicit.call
    for _ in repeat(None, n):
        call(f)

async def async_deco(n):
    for _ in repeat(None, n):
        await adeco()

async def async_call(n):
    call = aexplicit.call_async
    for _ in repeat(None, n):
        await call(af)

timeout = floodwall.Timeout(1.0)

async def timeout_call(n):
    call = timeout.call_async
    for _ in repeat(None, n):
        await call(af)

async def asyncio_timeout(n):
    for _ in repeat(None, n):
        async with asyncio.timeout(1.0):
            await af()

LOOPS = {
    "@CircuitBreaker": (sync_deco, False),
    "breaker.call(f)": (sync_call, False),
    "@CircuitBreaker (async def)": (async_deco, True),
    "breaker.call_async": (async_call, True),
    "timeout.call_async": (timeout_call, True),
    "async with asyncio.timeout": (asyncio_timeout, True),
}
loop = asyncio.new_event_loop()

async def timed_async(body, n):
    took = 0
    while n > 0:  # stretches of 100 calls, the event loop running (untimed) in between
        chunk = min(n, 100)
        await asyncio.sleep(0)
        t0 = time.perf_counter_ns()
        await body(chunk)
        took += time.perf_counter_ns() - t0
        n -= chunk
    return took

def timed(case, n):
    body, is_async = LOOPS[case]
    gc.collect()
    gc.disable()
    try:
        if is_async:
            return loop.run_until_complete(timed_async(body, n))
        t0 = time.perf_counter_ns()
        body(n)
        return time.perf_counter_ns() - t0
    finally:
        gc.enable()

for line in sys.stdin:
    case, n = json.loads(line)
    print(json.dumps(timed(case, n)), flush=True)
"""


class Worker:
    """One tree's process: ``sample(case, n)`` returns the ns that ``n`` calls took there."""

    def __init__(self, name: str, src: Path, cpu: int | None) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(src)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": ""},
        )
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(self.proc.pid, {cpu})

    def sample(self, case: str, n: int) -> int:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([case, n]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker exited (status {self.proc.wait()})")
        return int(json.loads(line))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def calibrate(worker: Worker, case: str, sample_ns: float) -> int:
    """A call count for which one sample lasts about ``sample_ns``."""
    n = 100
    while True:
        took = worker.sample(case, n)
        if took >= sample_ns / 8:
            return max(100, round(n * sample_ns / took))
        n *= 10 if took < sample_ns / 500 else 2


def unpack(rev: str, into: Path) -> Path:
    """``git archive REV src`` unpacked below ``into``; returns its ``src``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3])
    except OSError:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rev", default="f9b4933", help="the older revision (default f9b4933)")
    parser.add_argument("--rounds", type=int, default=41, help="interleaved rounds (default 41)")
    parser.add_argument("--sample-ms", type=float, default=30.0, help="ms per sample (30)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the round orders")
    parser.add_argument(
        "--cpu",
        type=int,
        default=max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        help="the CPU both workers are pinned to (default: the last one this process may use)",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    sample_ns = args.sample_ms * 1e6
    print(f"load average before: {loadavg()}")
    with tempfile.TemporaryDirectory(prefix="floodwall-versus-") as tmp:
        old_src = unpack(args.rev, Path(tmp))
        workers = {
            "this tree": Worker("this tree", ROOT / "src", args.cpu),
            args.rev: Worker(args.rev, old_src, args.cpu),
        }
        try:
            counts = {
                (tree, case): calibrate(worker, case, sample_ns)
                for tree, worker in workers.items()
                for case in CASES
            }
            per_call: dict[tuple[str, str], list[float]] = {key: [] for key in counts}
            for r in range(args.rounds):
                order = list(counts)
                rng.shuffle(order)
                for tree, case in order:
                    n = counts[tree, case]
                    per_call[tree, case].append(workers[tree].sample(case, n) / n)
                print(f"\rround {r + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
        finally:
            for worker in workers.values():
                worker.close()
    new, old = workers
    print(f"load average after: {loadavg()}")
    print(
        f"{args.rounds} rounds of one ~{args.sample_ms:g} ms sample per case and tree, "
        f"both workers on CPU {args.cpu}"
    )
    print(
        f"| case | {new} ns/call | {old} ns/call | difference (ns) | ratio "
        f"| {new} min | {old} min | difference of mins |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    verdict = ""
    for case in CASES:
        a, b = per_call[new, case], per_call[old, case]
        diff = statistics.median(x - y for x, y in zip(a, b, strict=True))
        ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
        print(
            f"| {case} | {statistics.median(a):,.0f} | {statistics.median(b):,.0f} "
            f"| {diff:+,.0f} | {ratio:.2f} | {min(a):,.0f} | {min(b):,.0f} "
            f"| {min(a) - min(b):+,.0f} |"
        )
        if case == BAR_CASE:
            verdict = (
                f"{BAR_CASE}: {diff:+.0f} ns vs {old} "
                f"({'PASS' if diff <= BAR_NS else 'FAIL'}, bar +{BAR_NS:g} ns)"
            )
    print(verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
