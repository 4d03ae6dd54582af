"""The task guard (issue 21): what one delivery of a task costs the worker, beside a plain call.

The task is the cheapest possible (``return 1``) and the broker is left out: the figures are
what :class:`floodwall.integrations._tasks.TaskGuard` adds to a delivery (reading the headers,
setting and restoring the retry marker and key, the policy's admission), to compare with what a
queue spends per message (Celery and Dramatiq: a broker round trip and serialisation, hundreds
of microseconds). A new message id per delivery, as a broker gives.
"""

from __future__ import annotations

from itertools import count, repeat

import floodwall as fw
from _harness import Case, SyncLoop
from floodwall.integrations._tasks import Delivery, TaskGuard

GROUP = "task guard, one delivery (sync)"
PLAIN = "plain call f()"
HEADERS = {"floodwall-attempt": "1"}


def f() -> int:
    return 1


def _loop(guard: TaskGuard) -> SyncLoop:
    ids = count()

    def run(n: int) -> None:
        read, go = Delivery.read, guard.run
        for _ in repeat(None, n):
            go(read("t", str(next(ids)), HEADERS), f)

    return run


def _plain(n: int) -> None:
    for _ in repeat(None, n):
        f()


def cases() -> list[Case]:
    refused = fw.CircuitBreaker("refused")
    refused.force_open()
    return [
        Case(GROUP, PLAIN, loop=_plain, ref=PLAIN),
        Case(GROUP, "TaskGuard() (headers, marker, no policy)", loop=_loop(TaskGuard())),
        Case(
            GROUP,
            "TaskGuard(breaker, retry=Retry(...))",
            loop=_loop(TaskGuard(fw.CircuitBreaker("b"), retry=fw.Retry("r"))),
        ),
        Case(
            GROUP,
            "TaskGuard(idempotency=Idempotency('memory://'))",
            loop=_loop(TaskGuard(idempotency=fw.Idempotency("memory://"))),
        ),
        Case(
            GROUP,
            "TaskGuard(breaker forced open): a deferral",
            loop=_loop(TaskGuard(refused)),
        ),
    ]
