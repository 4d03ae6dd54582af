"""WriteBehind on Redis Streams against a real PostgreSQL ledger: a downstream outage and a
SIGKILLed worker process lose no write and apply none twice.

The ledger is the pattern docs/degradation.md recommends for at-least-once delivery: each
write, in one transaction, records its idempotency key in ``applied`` (primary key) and, only
if the key is new, adds its amount to an account's balance. A write applied twice would show as
a balance above the sum of the amounts; a lost one as a missing key. Every delivery is also
logged in ``deliveries`` (no constraint), which shows the redeliveries that the key absorbed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

import floodwall as fw
from floodwall.backoff import Fixed
from floodwall.shared import StreamQueue, WriteBehind

pytestmark = pytest.mark.integration


def ledger_sql(table: str) -> list[str]:
    return [
        f"CREATE TABLE applied_{table} (seq bigserial, key text PRIMARY KEY, amount bigint)",
        f"CREATE TABLE deliveries_{table} (key text, pid int)",
        f"CREATE TABLE account_{table} (id int PRIMARY KEY, balance bigint)",
        f"INSERT INTO account_{table} VALUES (1, 0)",  # noqa: S608 - a generated table name
    ]


APPLY = """
def apply(conn, table, payload, key, pid):
    conn.execute(f"INSERT INTO deliveries_{table} (key, pid) VALUES (%s, %s)", (key, pid))
    with conn.transaction():
        new = conn.execute(
            f"INSERT INTO applied_{table} (key, amount) VALUES (%s, %s) "
            "ON CONFLICT (key) DO NOTHING RETURNING key",
            (key, payload["amount"]),
        ).fetchone()
        if new is not None:
            conn.execute(
                f"UPDATE account_{table} SET balance = balance + %s WHERE id = 1",
                (payload["amount"],),
            )
"""
namespace: dict[str, Any] = {}
exec(APPLY, namespace)  # noqa: S102 - the same code the worker subprocess runs
apply_write = namespace["apply"]


@pytest.fixture
def ledger(postgres_dsn: str) -> Iterator[str]:
    table = f"t{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for statement in ledger_sql(table):
            conn.execute(statement)
    yield table
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for kind in ("applied", "deliveries", "account"):
            conn.execute(f"DROP TABLE IF EXISTS {kind}_{table}")


def audit(dsn: str, table: str) -> dict[str, Any]:
    def one(conn: psycopg.Connection[Any], sql: str) -> Any:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return row[0]

    # every statement names generated tables only
    with psycopg.connect(dsn, autocommit=True) as conn:
        ordered = f"SELECT key FROM applied_{table} ORDER BY seq"  # noqa: S608
        return {
            "keys": [row[0] for row in conn.execute(ordered)],
            "amounts": one(conn, f"SELECT coalesce(sum(amount), 0) FROM applied_{table}"),  # noqa: S608
            "balance": one(conn, f"SELECT balance FROM account_{table}"),  # noqa: S608
            "deliveries": one(conn, f"SELECT count(*) FROM deliveries_{table}"),  # noqa: S608
        }


def test_a_downstream_outage_delays_writes_and_loses_none(
    redis_url: str, postgres_dsn: str, ledger: str
) -> None:
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    conn.execute("SET lock_timeout = '100ms'")

    def write(payload: dict[str, int]) -> None:
        apply_write(conn, ledger, payload, fw.current_idempotency_key(), 0)

    queue = StreamQueue(redis_url, f"wb-{ledger}", consumer="c1", prefix=f"{ledger}:")
    writer = WriteBehind(write, queue=queue, backoff=Fixed(0.05), batch=10)
    locker = psycopg.connect(postgres_dsn)
    try:
        for n in range(40):
            writer.submit({"amount": n + 1}, key=f"w{n}")
        writer.deliver(limit=15)
        locker.execute(f"LOCK TABLE applied_{ledger} IN ACCESS EXCLUSIVE MODE")  # outage
        for n in range(40, 80):
            writer.submit({"amount": n + 1}, key=f"w{n}")  # callers never notice
        for _ in range(5):
            fw.SYSTEM_CLOCK.sleep(0.06)
            writer.deliver()
        assert writer.failures >= 3 and writer.pending() == 65
        locker.rollback()  # the database is back
        while writer.pending():
            fw.SYSTEM_CLOCK.sleep(0.06)
            writer.deliver()
    finally:
        locker.close()
        conn.close()
        queue.stream.delete()
        queue.stream.store.close()
    result = audit(postgres_dsn, ledger)
    assert result["keys"] == [f"w{n}" for n in range(80)], "all applied, in order"
    assert result["balance"] == sum(range(1, 81)) == result["amounts"]
    assert writer.delivered == 80


WORKER = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import psycopg
    import floodwall as fw
    from floodwall.shared import StreamQueue, WriteBehind

    redis_url, dsn, table, mode, total = sys.argv[1:6]
    total = int(total)
    conn = psycopg.connect(dsn, autocommit=True)
    pid = os.getpid()
    {apply}

    def write(payload):
        apply(conn, table, payload, fw.current_idempotency_key(), pid)
        time.sleep(0.002)  # the rest of the request's work, after the effect committed

    queue = StreamQueue(redis_url, "wb-" + table, consumer="worker-1", prefix=table + ":")
    writer = WriteBehind(write, queue=queue, batch=20, idle_wait=0.005)

    def produce():
        for n in range(total):
            writer.submit({{"amount": n + 1}}, key=f"w{{n}}")
            print(json.dumps({{"accepted": f"w{{n}}"}}), flush=True)
            time.sleep(0.001)
        print(json.dumps({{"produced": total}}), flush=True)

    if mode == "both":
        threading.Thread(target=produce, daemon=True).start()
    while True:
        if not writer.deliver():
            if mode == "consume" and writer.pending() == 0:
                break
            time.sleep(0.005)
    print(json.dumps({{"drained": True, "delivered": writer.delivered}}), flush=True)
    """
)


def test_a_killed_worker_loses_no_write_and_applies_none_twice(
    redis_url: str, postgres_dsn: str, ledger: str, tmp_path: Path
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(apply=textwrap.indent(APPLY, "    ").strip()))
    total = 400
    argv = [sys.executable, str(script), redis_url, postgres_dsn, ledger]
    accepted: list[str] = []
    first = subprocess.Popen([*argv, "both", str(total)], stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    try:
        for line in first.stdout:  # kill mid-stream: production and delivery both under way
            accepted.append(json.loads(line)["accepted"])
            if len(accepted) >= 150 and len(audit(postgres_dsn, ledger)["keys"]) >= 40:
                break
        first.kill()  # SIGKILL: no cleanup, no ack of the batch in hand
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    before = audit(postgres_dsn, ledger)
    assert 0 < len(before["keys"]) < len(accepted) < total, "killed mid-stream"
    second = subprocess.run(
        [*argv, "consume", "0"], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(second.stdout.splitlines()[-1])["drained"]
    after = audit(postgres_dsn, ledger)
    with redis.Redis.from_url(redis_url) as client:
        client.delete(f"{ledger}:{{stream:wb-{ledger}}}")
    applied = after["keys"]
    assert set(accepted) <= set(applied), "every accepted write was applied"
    assert len(applied) == len(set(applied)), "none applied twice"
    assert set(applied) <= {f"w{n}" for n in range(total)}
    assert after["balance"] == after["amounts"], "the balance counts each write once"
    print(
        f"\nWriteBehind restart: {len(accepted)} writes accepted before SIGKILL, "
        f"{len(before['keys'])} applied by then, {len(applied)} applied after the restart; "
        f"{after['deliveries']} deliveries ({after['deliveries'] - len(applied)} redelivered "
        "and absorbed by the key)"
    )
