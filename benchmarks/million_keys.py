"""A million distinct keys through the bounded per-key tables: memory held and decision latency.

``python benchmarks/million_keys.py [--keys N] [--case NAME ...]``

Each case runs in a fresh child process (so its memory is its own) and sends ``--keys``
(default 1 000 000) distinct keys, one decision each, on the system clock with the garbage
collector on, as an application would:

* ``frequency``: ``Frequency(limit=5, per=3600)`` on ``memory://`` (default ``max_keys``): every
  record stays live, so past the bound each new key evicts the oldest record;
* ``frequency-expiring``: the same with ``per=0.2`` s: the sweeping hand drops expired records;
* ``keyed``: ``Keyed(TokenBucket("10/s"))`` (default ``max_keys``): keys go idle after 0.1 s and
  are evicted to make room;
* ``keyed-active``: ``Keyed(FixedWindow("5/h"))``: every key stays active, so once the table
  is full new keys are refused (after one pass spread over the new keys);
* ``keyed-1m``: ``Keyed(TokenBucket("10/s"), max_keys=1_000_000)``: the table grows to a million;
* ``baseline``: no floodwall, a pure-Python body of about one ``Frequency`` decision's cost (30
  dict insertions and removals of fresh strings): the machine's own tail, to read the others by.

Reported per case: decisions timed one by one, on the wall clock (``perf_counter_ns``) and in
the thread's CPU time (``thread_time_ns``, which leaves out the time the process waited for a
core: on a busy machine the wall tail is the scheduler's, the CPU tail the code's); p50 / p99 /
p99.9 in microseconds and the worst in milliseconds; the same over the *calm* decisions, those
during which the thread was not preempted (``ru_nivcsw`` unchanged, Linux), with how many were
preempted; the growth of the process's peak RSS over the run; the garbage collector's full
(generation 2) collections during the run and its longest collection of any generation, in ms
(from ``gc.callbacks``: a fresh process has run no full collection yet, so its first one, which
walks every object and dict entry the process holds, may land in the run); the records or keys
held at the end, the bound, and how many were evicted.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

CASES = ("baseline", "frequency", "frequency-expiring", "keyed", "keyed-active", "keyed-1m")


def baseline_body() -> tuple[Callable[[str], None], dict[str, int]]:
    """The machine's own tail: about one decision's worth of pure Python (30 dict insertions
    and removals of fresh strings), and the dict it works on."""
    scratch: dict[str, int] = {}

    def body(key: str) -> None:
        for j in range(30):
            name = f"{key}-{j}"
            scratch[name] = j
            del scratch[name]

    return body, scratch


def _build(case: str) -> tuple[Callable[[str], object], Callable[[], dict[str, Any]]]:
    """The decision to time, and what to report about the table afterwards."""
    from floodwall import Frequency
    from floodwall.ratelimit import FixedWindow, Keyed, TokenBucket
    from floodwall.stores import MemoryStore

    if case == "baseline":
        body, scratch = baseline_body()
        return body, lambda: {"held": len(scratch), "bound": 0, "evicted": 0}
    if case.startswith("frequency"):
        store = MemoryStore()
        per = 3600.0 if case == "frequency" else 0.2
        frequency = Frequency(limit=5, per=per, store=store)

        def held() -> dict[str, Any]:
            return {"held": len(store), "bound": store.max_keys, "evicted": store.evicted}

        return frequency.allow, held
    if case == "keyed-active":
        keyed: Keyed[Any] = Keyed(FixedWindow("5/h"))
    elif case == "keyed-1m":
        keyed = Keyed(TokenBucket("10/s"), max_keys=1_000_000)
    else:
        keyed = Keyed(TokenBucket("10/s"))

    def keys_held() -> dict[str, Any]:
        return {"held": len(keyed), "bound": keyed.max_keys, "evicted": keyed.evicted}

    return keyed.try_acquire, keys_held


def _switches() -> int:
    """Involuntary context switches of this thread so far (0 where the OS does not say)."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    return 0 if who is None else resource.getrusage(who).ru_nivcsw


def _rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


def run_case(case: str, keys: int) -> dict[str, Any]:
    decide, held = _build(case)
    for i in range(1000):  # warm the code paths before the memory baseline
        decide(f"warm-{i}")
    wall = array("q", bytes(8 * keys))  # raw integers: no objects of their own
    cpu = array("q", bytes(8 * keys))
    switched = bytearray(keys)
    before = _rss_mb()
    perf, thread = time.perf_counter_ns, time.thread_time_ns
    collections = [0, 0]  # full collections, longest collection (ns)
    began = [0]

    def collecting(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = perf()
            return
        collections[0] += info["generation"] == 2
        collections[1] = max(collections[1], perf() - began[0])

    gc.callbacks.append(collecting)
    started = time.monotonic()
    for i in range(keys):
        key = f"user-{i}"
        s0 = _switches()
        c0, t0 = thread(), perf()
        decide(key)
        t1, c1 = perf(), thread()
        switched[i] = _switches() != s0
        wall[i], cpu[i] = t1 - t0, c1 - c0
    elapsed = time.monotonic() - started
    gc.callbacks.remove(collecting)
    grown = _rss_mb() - before
    walls, cpus = sorted(wall), sorted(cpu)
    calm = sorted(w for w, s in zip(wall, switched, strict=True) if not s)

    def pct(timings: list[int], q: float) -> float:
        return timings[min(len(timings) - 1, int(q * len(timings)))] / 1000

    return {
        "case": case,
        "keys": keys,
        "seconds": round(elapsed, 2),
        "p50_us": round(pct(walls, 0.5), 2),
        "p99_us": round(pct(walls, 0.99), 2),
        "p999_us": round(pct(walls, 0.999), 2),
        "worst_ms": round(walls[-1] / 1e6, 3),
        "cpu_p999_us": round(pct(cpus, 0.999), 2),
        "cpu_worst_ms": round(cpus[-1] / 1e6, 3),
        "preempted": keys - len(calm),
        "calm_p999_us": round(pct(calm, 0.999), 2),
        "calm_worst_ms": round(calm[-1] / 1e6, 3),
        "rss_growth_mb": round(grown, 1),
        "full_gcs": collections[0],
        "gc_worst_ms": round(collections[1] / 1e6, 3),
        **held(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--case", action="append", choices=CASES)
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(run_case(options.child, options.keys)))
        return
    header = (
        f"{'case':20} {'p50 µs':>8} {'p99 µs':>8} {'p99.9 µs':>9} {'worst ms':>9} "
        f"{'cpu p99.9':>9} {'cpu worst':>9} {'preempted':>9} {'calm p99.9':>10} "
        f"{'calm worst':>10} {'RSS +MB':>8} {'full GCs':>8} {'GC ms':>7} {'held':>8} {'bound':>8} "
        f"{'evicted':>8}"
    )
    print(header)
    for case in options.case or CASES:
        child = subprocess.run(
            [sys.executable, str(Path(__file__)), "--child", case, "--keys", str(options.keys)],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(child.stdout.strip().splitlines()[-1])
        print(
            f"{r['case']:20} {r['p50_us']:8.2f} {r['p99_us']:8.2f} {r['p999_us']:9.2f} "
            f"{r['worst_ms']:9.3f} {r['cpu_p999_us']:9.2f} {r['cpu_worst_ms']:9.3f} "
            f"{r['preempted']:9} {r['calm_p999_us']:10.2f} {r['calm_worst_ms']:10.3f} "
            f"{r['rss_growth_mb']:8.1f} {r['full_gcs']:8} {r['gc_worst_ms']:7.3f} {r['held']:8} "
            f"{r['bound']:8} {r['evicted']:8}",
            flush=True,
        )


if __name__ == "__main__":
    main()
