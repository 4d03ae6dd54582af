"""Smoke tests for the throwaway servers the harness starts (tests/servers.py)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from redis.cluster import RedisCluster as RedisClusterClient
from redis.crc import key_slot

from servers import RedisServer, pid_alive

pytestmark = pytest.mark.integration


def test_redis_ping_set_get(redis_client: redis.Redis) -> None:
    assert redis_client.ping() is True
    assert redis_client.set("floodwall:smoke", "1") is True
    assert redis_client.get("floodwall:smoke") == b"1"


def _master_slot_ranges(client: RedisClusterClient) -> dict[str, list[tuple[int, int]]]:
    """``host:port`` of every master, with the slot ranges it serves (from CLUSTER NODES)."""
    masters: dict[str, list[tuple[int, int]]] = {}
    for address, detail in client.cluster_nodes().items():
        if "master" not in str(detail["flags"]):
            continue
        spans = detail["slots"]
        assert isinstance(spans, list)
        masters[address] = [
            (int(span[0]), int(span[-1])) for span in spans if isinstance(span, list)
        ]
    return masters


def test_redis_cluster_three_masters_serve_keys_on_every_node(redis_cluster_url: str) -> None:
    parts = urlsplit(redis_cluster_url)
    assert parts.scheme == "redis+cluster"
    assert parts.hostname is not None
    assert parts.port is not None
    client = RedisClusterClient(host=parts.hostname, port=parts.port)
    try:
        info = client.cluster_info()
        assert info["cluster_state"] == "ok"
        assert info["cluster_size"] == "3"
        masters = _master_slot_ranges(client)
        assert len(masters) == 3

        # One key per master: walk candidate keys until every master owns one.
        keys: dict[str, str] = {}
        for i in range(1000):
            key = f"floodwall:smoke:{i}"
            slot = key_slot(key.encode())
            owner = next(
                a for a, spans in masters.items() if any(lo <= slot <= hi for lo, hi in spans)
            )
            keys.setdefault(owner, key)
            if len(keys) == len(masters):
                break
        assert len(keys) == 3
        assert len({key_slot(key.encode()) for key in keys.values()}) == 3

        for address, key in keys.items():
            assert client.set(key, address) is True
        for address, key in keys.items():
            assert client.get(key) == address.encode()
            host, _, port = address.rpartition(":")
            node = redis.Redis(host=host, port=int(port))  # the key really lives on its master
            try:
                assert node.get(key) == address.encode()
            finally:
                node.close()
            client.delete(key)
    finally:
        client.close()


def test_postgres_create_insert_select(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, connect_timeout=10) as conn:
        conn.execute("CREATE TEMPORARY TABLE smoke (id integer PRIMARY KEY, name text NOT NULL)")
        conn.execute("INSERT INTO smoke (id, name) VALUES (%s, %s), (%s, %s)", (1, "a", 2, "b"))
        rows = conn.execute("SELECT id, name FROM smoke ORDER BY id").fetchall()
    assert rows == [(1, "a"), (2, "b")]


def test_stopping_redis_server_kills_pid_and_frees_port() -> None:
    server = RedisServer().start()
    pid, port, tmp = server.pid, server.port, server.dir
    assert tmp is not None
    assert pid_alive(pid)
    client = redis.Redis(host="127.0.0.1", port=port)
    assert client.ping() is True
    client.close()

    server.stop()

    assert not pid_alive(pid)
    assert server.proc is not None
    assert server.proc.returncode is not None
    assert not tmp.exists()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR tolerates TIME_WAIT leftovers but never a live listener.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
    server.stop()  # idempotent
