"""Host-wide bulkhead cost: one acquire + release, beside the in-memory bulkhead and a Redis
concurrency limit.

``python benchmarks/host.py [--rounds N] [--n CYCLES]``

Cases, each one acquire and one release of a slot (uncontended: the path every admitted call
takes):

* ``memory``: :class:`floodwall.Bulkhead` (``acquire()`` / ``release()``), this process only;
* ``host``: :class:`floodwall.HostBulkhead` on ``host://`` (``acquire()`` / ``release(permit)``:
  two ``semop`` system calls with ``SEM_UNDO``), every process of the host;
* ``host slots``: the same two system calls without the gate (``HostSlots.take`` / ``give``);
* ``redis``: a Redis concurrency limit (one ``EVALSHA`` of a capped ``INCR``, one ``DECR``,
  redis-py) on a throwaway ``redis-server`` the script starts on a free loopback port;
* ``syscall``: two ``os.getppid()`` calls, the floor any system call pays on this machine.

Method: in each of ``--rounds`` rounds every case runs ``--n`` cycles (Redis: a tenth of them),
in a fresh random order, so the machine's drift hits every case of a round alike; a figure is
the median over rounds, a ratio the median of the per-round ratios. The load average is printed
beside the figures: the cost of a system call grows with a busy machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402

import floodwall as fw  # noqa: E402
from floodwall.stores.host import HostStore, remove  # noqa: E402
from servers import RedisServer  # noqa: E402

CAPPED_INCR = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(ARGV[1]) then redis.call('DECR', KEYS[1]); return 0 end
return 1
"""


def _timed(cycle: Callable[[], None], n: int) -> float:
    """Microseconds per cycle over ``n`` cycles."""
    gc.disable()
    try:
        began = time.perf_counter()
        for _ in range(n):
            cycle()
        return (time.perf_counter() - began) / n * 1e6
    finally:
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--n", type=int, default=20_000)
    options = parser.parse_args()
    name = f"bench{uuid.uuid4().hex[:12]}"
    store = HostStore(f"host://{name}")
    memory = fw.Bulkhead("memory", max_concurrent=10)
    host = fw.HostBulkhead("host", store=store, max_concurrent=10)
    slots = store.slots("raw", 10)
    getppid = os.getppid

    def memory_cycle() -> None:
        memory.acquire()
        memory.release()

    def host_cycle() -> None:
        host.release(host.acquire())

    def slots_cycle() -> None:
        slots.take()
        slots.give()

    def syscall_cycle() -> None:
        getppid()
        getppid()

    with RedisServer() as server:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        take = client.register_script(CAPPED_INCR)

        def redis_cycle() -> None:
            take(keys=["bench:inflight"], args=[10])
            client.decr("bench:inflight")

        cases: dict[str, tuple[Callable[[], None], int]] = {
            "memory": (memory_cycle, options.n),
            "host": (host_cycle, options.n),
            "host slots": (slots_cycle, options.n),
            "redis": (redis_cycle, max(100, options.n // 10)),
            "syscall": (syscall_cycle, options.n),
        }
        for cycle, n in cases.values():  # warm up (and open the host objects)
            _timed(cycle, max(1, n // 10))
        samples: dict[str, list[float]] = {case: [] for case in cases}
        load = os.getloadavg()
        for _ in range(options.rounds):
            order = list(cases)
            random.shuffle(order)
            for case in order:
                cycle, n = cases[case]
                samples[case].append(_timed(cycle, n))
        load_after = os.getloadavg()
        client.close()
    store.close()
    remove(name)
    print(f"load average {load[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} cores)")
    print(f"{'case':<12} {'µs / acquire+release (median)':>30} {'x memory':>10} {'x host':>8}")
    for case, values in samples.items():
        per_round_mem = [v / m for v, m in zip(values, samples["memory"], strict=True)]
        per_round_host = [v / h for v, h in zip(values, samples["host"], strict=True)]
        print(
            f"{case:<12} {statistics.median(values):>30.2f} "
            f"{statistics.median(per_round_mem):>10.2f} {statistics.median(per_round_host):>8.2f}"
        )


if __name__ == "__main__":
    main()
