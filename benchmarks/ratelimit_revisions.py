"""The local rate limiters of this checkout beside those of another revision, interleaved.

    python benchmarks/ratelimit_revisions.py REV [--rounds 200] [--calls 5000]

Exports ``src/floodwall`` at git revision ``REV`` into a temporary directory as a package named
``floodwall_rev`` (its imports rewritten), imports it beside this checkout's ``floodwall`` and
times the same four cases for each of the four limiters a store can hold: ``try_acquire()``,
``acquire()`` (a full Decision), ``Keyed(...).try_acquire('k')`` (all on a limit of 10⁹ per
second, never reached) and a refusal (a ``1/h`` limit, used up), as
``benchmarks/bench_ratelimit.py`` does against the peers.

Method: every round times one sample of ``--calls`` calls of the old case and one of the new,
in random order, garbage collector off, on the thread's **CPU time**
(:func:`time.thread_time_ns`): on a small machine shared with other work, wall-clock samples are
stretched by whatever else the CPUs run, while CPU time counts this thread's own work (caches and
frequency scaling aside). A row is the median over rounds of each sample's ns per call, and
``new/old`` the median of the per-round ratios with its p25–p75. The figures include the loop
(a few ns, the same for both).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import random
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from itertools import repeat
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HUGE = 10**9
"""Permits per second: never reached, every decision is an admission."""
LIMITERS = {
    "fixed window": "FixedWindow",
    "sliding window counter": "SlidingWindowCounter",
    "token bucket": "TokenBucket",
    "GCRA": "GCRA",
}
Loop = Callable[[int], None]


def export(rev: str, into: Path) -> None:
    """``src/floodwall`` at ``rev`` as the package ``floodwall_rev`` under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "src/floodwall"],
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout
    tar_path = into / "rev.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    package = into / "floodwall_rev"
    (into / "src" / "floodwall").rename(package)
    pattern = re.compile(r"\bfloodwall(?=\.|\s+import\b|$)", re.MULTILINE)
    for path in package.rglob("*.py"):
        path.write_text(pattern.sub("floodwall_rev", path.read_text()))


def loops(ratelimit: ModuleType, clock: type[Any], name: str) -> dict[str, Loop]:
    """The four timed loops of one limiter of one revision."""
    cls = getattr(ratelimit, LIMITERS[name])
    plain, decided, keyed = cls(HUGE), cls(HUGE), ratelimit.Keyed(cls(HUGE))
    refusing = cls("1/h", clock=clock())
    refusing.try_acquire()
    try_acquire, acquire = plain.try_acquire, decided.acquire
    keyed_try, refused = keyed.try_acquire, refusing.try_acquire

    def run_try(n: int) -> None:
        for _ in repeat(None, n):
            try_acquire()

    def run_acquire(n: int) -> None:
        for _ in repeat(None, n):
            acquire()

    def run_keyed(n: int) -> None:
        for _ in repeat(None, n):
            keyed_try("k")

    def run_refused(n: int) -> None:
        for _ in repeat(None, n):
            refused()

    return {
        "try_acquire": run_try,
        "acquire": run_acquire,
        "keyed": run_keyed,
        "refused": run_refused,
    }


def sample(loop: Loop, calls: int) -> float:
    """CPU ns per call of one run of ``loop``."""
    gc.disable()
    try:
        start = time.thread_time_ns()
        loop(calls)
        return (time.thread_time_ns() - start) / calls
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("rev", help="the git revision to compare with (e.g. main, HEAD~3)")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=5000, help="calls per sample")
    args = parser.parse_args(argv)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        export(args.rev, Path(tmp))
        sys.path.insert(0, tmp)
        old = importlib.import_module("floodwall_rev.ratelimit")
        old_clock = importlib.import_module("floodwall_rev").FakeClock
        new = importlib.import_module("floodwall.ratelimit")
        new_clock = importlib.import_module("floodwall").FakeClock
        print(f"| limiter | case | {args.rev} ns | this ns | this/{args.rev} | p25–p75 |")
        print("| --- | --- | ---: | ---: | ---: | --- |")
        for name in LIMITERS:
            before, after = loops(old, old_clock, name), loops(new, new_clock, name)
            for case, old_loop in before.items():
                new_loop = after[case]
                sample(old_loop, args.calls), sample(new_loop, args.calls)  # warm up
                olds: list[float] = []
                news: list[float] = []
                ratios: list[float] = []
                for _ in range(args.rounds):
                    pair = [(olds, old_loop), (news, new_loop)]
                    rng.shuffle(pair)
                    for into, loop in pair:
                        into.append(sample(loop, args.calls))
                    ratios.append(news[-1] / olds[-1])
                q1, _, q3 = statistics.quantiles(ratios, n=4)
                print(
                    f"| {name} | {case} | {statistics.median(olds):.0f} | "
                    f"{statistics.median(news):.0f} | {statistics.median(ratios):.3f} | "
                    f"{q1:.3f}–{q3:.3f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
