"""Shared state for policies that must agree across processes: chosen by URL.

===========================  ===============================================================
``memory://`` (default)      this process only (:class:`MemoryStore`)
``redis://``, ``rediss://``  one Redis / Valkey server (:class:`~floodwall.stores.redis.RedisStore`)
``redis+cluster://h:p``      Redis Cluster, any node(s) as seeds (``rediss+cluster://``: TLS)
``postgresql://``            PostgreSQL (:class:`~floodwall.stores.postgres.PostgresStore`)
``sqlite:///path.db``        one SQLite file, for the processes of one host
``host://NAME``              the processes of one host, no server: System V shared memory
                             and semaphores (:class:`~floodwall.stores.host.HostStore`; Linux)
===========================  ===============================================================

``connect(url, **options)`` returns a :class:`Store`; policies take it as ``store=`` (or the URL
itself). The interface and how to add an operation are in :mod:`floodwall.stores.base`; the
guard that turns an outage into each policy's configured behaviour is
:class:`~floodwall.stores.guard.StoreGuard`.

SQL schemas: ``migrate(url)`` creates or upgrades the tables (``floodwall_kv``,
``floodwall_idempotency``, ``floodwall_schema``); SQL stores also do it on first use unless built
with ``auto_migrate=False``.

Client libraries are imported only when a URL needs them (``pip install floodwall[redis]`` or
``floodwall[postgres]``).
"""

from __future__ import annotations

import inspect
from typing import Any
from urllib.parse import urlsplit

from floodwall._core import validate
from floodwall._core.errors import ConfigError
from floodwall.stores.base import (
    DELETE,
    KEEP,
    Arg,
    Op,
    R,
    Record,
    Store,
    StoreClosedError,
    StoreRecordTooLargeError,
    StoreTimeoutError,
    StoreUnavailableError,
    Write,
    redact,
)
from floodwall.stores.guard import Guarded, StoreDown, StoreErrorMode, StoreGuard
from floodwall.stores.memory import MemoryStore

__all__ = [
    "DELETE",
    "KEEP",
    "Arg",
    "Guarded",
    "MemoryStore",
    "Op",
    "R",
    "Record",
    "Store",
    "StoreClosedError",
    "StoreDown",
    "StoreErrorMode",
    "StoreGuard",
    "StoreRecordTooLargeError",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "Write",
    "connect",
    "migrate",
    "resolve",
]

SCHEMES = (
    "memory",
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "postgresql",
    "postgres",
    "sqlite",
    "host",
)


def connect(url: str = "memory://", **options: Any) -> Store:
    """The store ``url`` names (see the table above); ``options`` go to its constructor.

    Common options: ``prefix`` (default ``"floodwall:"``), ``timeout`` (seconds; default
    0.5 for servers, 5 for SQLite's write lock). Memory: ``clock``. Redis: ``clock`` (times the
    bounds of async calls) and any redis-py client option. PostgreSQL: ``pool_size``,
    ``auto_migrate``, ``clock`` (times the calls' bounds) and psycopg connect options. SQLite:
    ``auto_migrate``, ``wall_clock``. Host: ``max_keys``, ``record_bytes``, ``bulkheads``
    (also as URL query parameters). Nothing connects until the first operation.
    """
    validate.text("url", url)
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        return MemoryStore(url, **_known(MemoryStore, scheme, options))
    if scheme in {"redis", "rediss", "redis+cluster", "rediss+cluster", "postgresql", "postgres"}:
        _check_port(url)
    if scheme in {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}:
        from floodwall.stores.redis import RedisStore

        return RedisStore(url, **options)  # checks its client options against redis-py's
    if scheme in {"postgresql", "postgres"}:
        from floodwall.stores.postgres import PostgresStore

        return PostgresStore(url, **options)  # checks its connect options with libpq
    if scheme == "sqlite":
        from floodwall.stores.sqlite import SqliteStore

        return SqliteStore(url, **_known(SqliteStore, scheme, options))
    if scheme == "host":
        from floodwall.stores.host import HostStore

        return HostStore(url, **_known(HostStore, scheme, options))
    raise ConfigError(
        f"store url scheme must be one of {', '.join(s + '://' for s in SCHEMES)}, "
        f"got {redact(url)!r}"
    )


def _known(store: type[Store], scheme: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` if ``store``'s constructor takes each one, else a :class:`ConfigError`
    naming the unknown ones and the options there are."""
    taken = [p for p in inspect.signature(store).parameters if p != "url"]
    unknown = sorted(set(options) - set(taken))
    if unknown:
        raise ConfigError(
            f"{scheme}:// store options must be among {', '.join(taken)}, got {unknown}"
        )
    return options


def _check_port(url: str) -> None:
    """A server URL's ports, if given, must be ones a socket can use (checked now: a store
    connects only at its first operation, where a bad port would read as an outage)."""
    hosts = urlsplit(url).netloc.rpartition("@")[2]
    for host in hosts.split(","):  # PostgreSQL takes host:port,host:port
        try:
            port = urlsplit(f"//{host}").port
        except ValueError:
            port = 0
        if port == 0:
            raise ConfigError(f"store url port must be an integer in 1-65535, got {redact(url)!r}")


def resolve(store: Store | str | None, **options: Any) -> Store:
    """A policy's ``store=`` argument as a :class:`Store`: ``None`` → a new memory store, a URL
    → :func:`connect`, a store → itself."""
    if store is None:
        return MemoryStore(**options)
    if isinstance(store, str):
        return connect(store, **options)
    if not isinstance(store, Store):
        raise ConfigError(f"store must be a Store, a store URL or None, got {store!r}")
    return store


def migrate(url: str | Store, **options: Any) -> list[int]:
    """Create or upgrade floodwall's tables in the SQL database at ``url``; return the versions
    applied now (``[]`` when up to date, and for stores without a schema).

    Safe to run from several processes at once and again after a partial failure. Run it in a
    deploy step when the application's database user may not create tables, and build the
    stores with ``auto_migrate=False``.
    """
    if not isinstance(url, str | Store):
        raise ConfigError(f"url must be a store URL or a Store, got {url!r}")
    if isinstance(url, str):
        if urlsplit(url).scheme.lower() not in {"postgresql", "postgres", "sqlite"}:
            return []
        store = connect(url, auto_migrate=False, **options)
    else:
        store = url
    runner = getattr(store, "migrate", None)
    if runner is None:
        return []
    try:
        applied: list[int] = runner()
    finally:
        if isinstance(url, str):
            store.close()
    return applied
