"""10 000 duplicate pairs fired concurrently at the idempotency store: no double execution, no
lost record, on real Redis, Redis Cluster and PostgreSQL.

Each pair is two requests with one key, admitted back to back into a pool of ``CONCURRENCY``
async tasks, so the duplicate arrives while the first is in flight or just after it finished.
Every key must run exactly once; the other request gets the replayed result or a 409; and
afterwards every key's record must be done with its own result. Figures go to stdout (``-s``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import pytest

import floodwall
from floodwall.shared.idempotency import DuplicateInFlightError, Idempotency
from floodwall.stores import connect

pytestmark = pytest.mark.integration

PAIRS = 10_000
CONCURRENCY = 64


@pytest.mark.parametrize("fixture", ["redis_url", "redis_cluster_url", "postgres_dsn"])
async def test_duplicate_pairs_run_once_and_keep_every_record(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    url = str(request.getfixturevalue(fixture))
    options: dict[str, object] = {"pool_size": 16} if fixture == "postgres_dsn" else {}
    # Exactly-once under contention is the point here, not bounded waits (test_store_freeze
    # holds those to the 0.5 s default): 64 tasks on a busy 2-core machine can queue an op past
    # 0.5 s, and a fail-closed idempotency store then refuses the call instead of deduplicating.
    options["timeout"] = 5.0
    store = connect(url, prefix=f"dup-{uuid.uuid4().hex[:8]}:", **options)
    idem = Idempotency(store, lock_ttl=60)
    executions: Counter[int] = Counter()
    slots = asyncio.Semaphore(CONCURRENCY)

    async def write(n: int) -> dict[str, int]:
        executions[n] += 1
        await asyncio.sleep(0)  # let the duplicate interleave
        return {"n": n}

    async def submit(n: int) -> str:
        async with slots:
            with floodwall.idempotency_key(f"key-{n}"):
                try:
                    result = await idem.call_async(write, n)
                except DuplicateInFlightError:
                    return "409"
                assert result == {"n": n}
                return "ok"

    async def check(n: int) -> bool:
        async with slots:
            record = await idem.lookup_async(f"key-{n}")
            return record is not None and record.state == "done" and record.result == {"n": n}

    try:
        start = time.perf_counter()
        outcomes = Counter(
            await asyncio.gather(*(submit(n) for n in range(PAIRS) for _ in range(2)))
        )
        elapsed = time.perf_counter() - start
        kept = await asyncio.gather(*(check(n) for n in range(PAIRS)))
    finally:
        await store.aclose()

    doubles = sum(1 for count in executions.values() if count > 1)
    lost = kept.count(False)
    print(
        f"\n{fixture}: {PAIRS} pairs in {elapsed:.2f}s ({2 * PAIRS / elapsed:.0f} requests/s), "
        f"executions={sum(executions.values())}, double={doubles}, lost={lost}, "
        f"replayed={idem.replays}, 409={outcomes['409']}"
    )
    assert doubles == 0 and lost == 0
    assert len(executions) == PAIRS and sum(executions.values()) == PAIRS
    assert outcomes["ok"] + outcomes["409"] == 2 * PAIRS
    assert idem.guard.failures == 0
