"""``sqlite:///path``: records in an SQLite file, shared by the processes of one host.

URL forms follow SQLAlchemy: ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db``.

Each op runs its Python :meth:`~floodwall.stores.Op.step` inside ``BEGIN IMMEDIATE`` (SQLite's
write lock, so ops on one file are serialised across threads and processes), reading and writing
``floodwall_kv`` / ``floodwall_idempotency``. The clock is the host's wall clock (``time.time``,
injectable as ``wall_clock``): every process sharing the file is on that host. Migrating
switches the file to WAL mode. ``timeout`` (default 5 s) is how long an op waits for the write
lock before the store counts as unavailable.

Connections: a pool of at most ``pool_size`` (default 4), each taken for one op and handed back,
so descriptors stay bounded however many threads come and go (a connection per thread kept two
descriptors per thread that ever ran an op, until the process ran out). An op waits at most
``timeout`` for a free connection, as for the write lock. Async callers go through one worker
thread per store (SQLite allows one writer at a time anyway), so the event loop never blocks; an
async op waits at most ``timeout`` in all, its turn on that thread included.
After :meth:`SqliteStore.close` every op raises :class:`~floodwall.stores.StoreClosedError`.

Schema: the migrations in ``floodwall/stores/sql/sqlite/`` are applied on first use
(``auto_migrate``, default on) or by :func:`floodwall.stores.migrate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError
from floodwall.stores import _sql
from floodwall.stores.base import (
    Arg,
    Op,
    R,
    Store,
    StoreClosedError,
    StoreTimeoutError,
    StoreUnavailableError,
)

__all__ = ["SqliteStore", "sqlite_path"]

SQLITE_TIMEOUT = 5.0
SQLITE_POOL_SIZE = 4
"""Connections per store: ops on one file are serialised by its write lock anyway."""
_BACKEND_ERRORS = (sqlite3.Error, OSError)


def sqlite_path(url: str) -> str:
    """The file path in a ``sqlite:///…`` URL (three slashes: relative, four: absolute)."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc or not parts.path.startswith("/"):
        raise ConfigError(f"url must look like sqlite:///path/to/file.db, got {url!r}")
    path = parts.path[1:]
    if not path or path == ":memory:":
        raise ConfigError(
            f"an SQLite store needs a file (records are shared between connections), got {url!r}"
        )
    return path


def _drop(future: asyncio.Future[Any]) -> None:
    """Retrieve a late op's outcome, so an error nobody waits for is not logged as lost."""
    if not future.cancelled():
        future.exception()


class SqliteStore(Store):
    """A store in one SQLite file (see [Distributed state][guide-distributed])."""

    timeout: float

    def __init__(
        self,
        url: str,
        *,
        prefix: str = defaults.STORE_PREFIX,
        timeout: float = SQLITE_TIMEOUT,
        pool_size: int = SQLITE_POOL_SIZE,
        auto_migrate: bool = True,
        wall_clock: Callable[[], float] = time.time,
        purge_every: int = defaults.STORE_SQL_PURGE_EVERY,
    ) -> None:
        super().__init__(url, prefix=prefix)
        validate.seconds("timeout", timeout, positive=True)
        validate.count("pool_size", pool_size)
        self.path = sqlite_path(url)
        self.timeout = float(timeout)
        self.pool_size = pool_size
        self.auto_migrate = auto_migrate
        self.wall_clock = wall_clock
        self.purge_every = purge_every
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._slots = threading.BoundedSemaphore(pool_size)
        self._closed = False
        self._migrated = False
        self._ops = 0
        self._executor: ThreadPoolExecutor | None = None

    # -- connections ----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    @contextlib.contextmanager
    def _conn(self, op: str) -> Iterator[sqlite3.Connection]:
        """A pooled connection for one op, every error as a typed store error."""
        if self._closed:
            raise StoreClosedError(self.url, op)
        if not self._slots.acquire(timeout=self.timeout):
            raise StoreTimeoutError(self.url, op) from TimeoutError("every connection busy")
        conn: sqlite3.Connection | None = None
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect()
            yield conn
        except BaseException as exc:
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
                conn = None
            if isinstance(exc, StoreUnavailableError) or not isinstance(exc, _BACKEND_ERRORS):
                raise
            raise self._failure(exc, op) from exc
        finally:
            if conn is not None:
                with self._lock:
                    keep = not self._closed
                    if keep:
                        self._idle.append(conn)
                if not keep:
                    conn.close()
            self._slots.release()

    def _failure(self, exc: BaseException, op: str) -> StoreUnavailableError:
        if self._closed:
            error: StoreUnavailableError = StoreClosedError(self.url, op)
        elif isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            error = StoreTimeoutError(self.url, op)  # the write lock not free within timeout
        else:
            error = StoreUnavailableError(self.url, op)
        error.__cause__ = exc
        return error

    # -- schema ---------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply the migrations this file lacks; return their versions."""
        with self._conn("migrate") as conn:
            return self._migrate(conn)

    def _migrate(self, conn: sqlite3.Connection) -> list[int]:
        with self._lock:  # switching to WAL needs the file to itself; it persists in the file
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {_sql.SCHEMA_TABLE} "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            query = f"SELECT version FROM {_sql.SCHEMA_TABLE}"  # noqa: S608 - fixed name
            done = {row[0] for row in conn.execute(query)}
            applied = []
            for migration in _sql.migrations("sqlite"):
                if migration.version in done:
                    continue
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute(
                    f"INSERT INTO {_sql.SCHEMA_TABLE} VALUES (?, ?, ?)",  # noqa: S608 - fixed name
                    (migration.version, migration.name, self.wall_clock()),
                )
                applied.append(migration.version)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self._migrated = True
        return applied

    # -- the interface --------------------------------------------------------------------

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        keys = self.keys(op, key)
        name = _sql.table(op)
        with self._conn(op.script) as conn:
            if self.auto_migrate and not self._migrated:
                self._migrate(conn)
            result = self._run(conn, op, name, keys, args)
            self._ops += 1
            if self._ops % self.purge_every == 0:
                self._purge(conn)
        return result

    def _run(
        self, conn: sqlite3.Connection, op: Op[R], name: str, keys: list[str], args: Sequence[Arg]
    ) -> R:
        marks = ", ".join("?" * len(keys))
        conn.execute("BEGIN IMMEDIATE")
        try:
            rows = {
                row[0]: (row[1], row[2])
                for row in conn.execute(
                    f"SELECT key, value, expires_at FROM {name} WHERE key IN ({marks})",  # noqa: S608
                    keys,
                )
            }
            now = self.wall_clock()
            writes, result = op.step(_sql.records(keys, rows, now), now, args)
            upserts, deletes = _sql.plan(keys, rows, writes)
            if upserts:
                conn.executemany(
                    f"INSERT OR REPLACE INTO {name} (value, expires_at, key) VALUES (?, ?, ?)",  # noqa: S608
                    upserts,
                )
            if deletes:
                conn.executemany(f"DELETE FROM {name} WHERE key = ?", [(k,) for k in deletes])  # noqa: S608
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        return result

    def _purge(self, conn: sqlite3.Connection) -> int:
        now = self.wall_clock()
        removed = 0
        for name in _sql.TABLES.values():
            cursor = conn.execute(
                f"DELETE FROM {name} WHERE key IN (SELECT key FROM {name} "  # noqa: S608
                "WHERE expires_at < ? LIMIT ?)",
                (now, defaults.STORE_SQL_PURGE_BATCH),
            )
            removed += cursor.rowcount
        return removed

    def purge_expired(self) -> int:
        """Delete up to ``STORE_SQL_PURGE_BATCH`` expired rows per table; return how many."""
        with self._conn("purge") as conn:
            return self._purge(conn)

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        executor = self._executor
        if executor is None:
            with self._lock:
                if self._closed:
                    raise StoreClosedError(self.url, op.script)
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="floodwall-sqlite")
                executor = self._executor
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(executor, self.apply, op, key, args)
        except RuntimeError as exc:  # the worker was shut down by close()
            raise StoreClosedError(self.url, op.script) from exc
        try:
            # queued behind other ops on the one worker: at most the timeout in all; a late op
            # still runs, and its answer is dropped
            return await asyncio.wait_for(asyncio.shield(future), self.timeout)
        except TimeoutError as exc:
            future.add_done_callback(_drop)
            raise StoreTimeoutError(self.url, op.script) from exc

    def ping(self) -> None:
        with self._conn("ping") as conn:
            conn.execute("SELECT 1")

    async def aclose(self) -> None:
        """Close the idle connections; the store stays usable (:meth:`close` ends it)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            executor, self._executor = self._executor, None
        if executor is not None:  # queued ops still run, and find the store closed
            executor.shutdown(wait=False)
        for conn in idle:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
