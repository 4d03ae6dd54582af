"""``sqlite:///path``: records in an SQLite file, shared by the processes of one host.

URL forms follow SQLAlchemy: ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db``.

Each op runs its Python :meth:`~floodwall.stores.Op.step` inside ``BEGIN IMMEDIATE`` (SQLite's
write lock, so ops on one file are serialised across threads and processes), reading and writing
``floodwall_kv`` / ``floodwall_idempotency``. The clock is the host's wall clock (``time.time``,
injectable as ``wall_clock``): every process sharing the file is on that host. Migrating
switches the file to WAL mode. ``timeout`` (default 5 s) is how long an op waits for the write
lock before the store counts as unavailable.

Sync callers get one connection per thread; async callers go through one worker thread per
store (SQLite allows one writer at a time anyway), so the event loop never blocks.

Schema: the migrations in ``floodwall/stores/sql/sqlite/`` are applied on first use
(``auto_migrate``, default on) or by :func:`floodwall.stores.migrate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from floodwall._core import defaults
from floodwall._core.errors import ConfigError
from floodwall.stores import _sql
from floodwall.stores.base import Arg, Op, R, Store, StoreUnavailableError

__all__ = ["SqliteStore", "sqlite_path"]

SQLITE_TIMEOUT = 5.0
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


class SqliteStore(Store):
    """A store in one SQLite file (see [Distributed state][guide-distributed])."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = defaults.STORE_PREFIX,
        timeout: float = SQLITE_TIMEOUT,
        auto_migrate: bool = True,
        wall_clock: Callable[[], float] = time.time,
        purge_every: int = defaults.STORE_SQL_PURGE_EVERY,
    ) -> None:
        super().__init__(url, prefix=prefix)
        if not timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.path = sqlite_path(url)
        self.timeout = float(timeout)
        self.auto_migrate = auto_migrate
        self.wall_clock = wall_clock
        self.purge_every = purge_every
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._generation = 0
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

    def _conn(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "generation", None) != self._generation:
            fresh = self._connect()
            with self._lock:
                self._connections.append(fresh)
            local.conn, local.generation = fresh, self._generation
        conn: sqlite3.Connection = local.conn
        return conn

    # -- schema ---------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply the migrations this file lacks; return their versions."""
        try:
            return self._migrate(self._conn())
        except _BACKEND_ERRORS as exc:
            raise StoreUnavailableError(self.url, "migrate") from exc

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
        try:
            conn = self._conn()
            if self.auto_migrate and not self._migrated:
                self._migrate(conn)
            result = self._run(conn, op, name, keys, args)
            self._ops += 1
            if self._ops % self.purge_every == 0:
                self._purge(conn)
        except _BACKEND_ERRORS as exc:
            raise StoreUnavailableError(self.url, op.script) from exc
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
        try:
            return self._purge(self._conn())
        except _BACKEND_ERRORS as exc:
            raise StoreUnavailableError(self.url, "purge") from exc

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        executor = self._executor
        if executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="floodwall-sqlite")
                executor = self._executor
        return await asyncio.get_running_loop().run_in_executor(executor, self.apply, op, key, args)

    def ping(self) -> None:
        try:
            self._conn().execute("SELECT 1")
        except _BACKEND_ERRORS as exc:
            raise StoreUnavailableError(self.url, "ping") from exc

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
            self._generation += 1
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
