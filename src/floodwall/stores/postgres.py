"""``postgresql://``: records in PostgreSQL tables, shared by every replica.

Each op is one short transaction:

1. ``INSERT INTO floodwall_<table> … SELECT … ORDER BY key ON CONFLICT (key) DO UPDATE …
   RETURNING key, value, expires_at, clock_timestamp()`` creates a placeholder row for every
   absent key (the primary key is the unique index that serialises concurrent inserts), takes
   the row locks in key order (no deadlocks between multi-key ops), and reads the records and
   the server's clock, all in one statement;
2. the op's writes (``UPDATE``/``DELETE``), then ``COMMIT``.

Four round trips with ``BEGIN`` (about 0.35 ms on loopback; psycopg's pipeline mode measured
slower here, its syncs cost more than the round trips they save).

So concurrent ops on one key run one after another, in ``READ COMMITTED``, with the server's clock
(``clock_timestamp()``) as the only clock. A placeholder an op did not fill is deleted in the
same transaction; expired rows read as absent and are purged in batches every
``purge_every`` ops (and by :meth:`PostgresStore.purge_expired`).

Connections: a small pool of ``pool_size`` (default 10) autocommit connections for sync callers,
and one per running event loop for async callers (``psycopg.AsyncConnection``). A connection
that failed, or whose op was cancelled, is closed rather than reused; so is an idle one the server
hung up on (a restart, a failover, a terminated backend: see :func:`_hung_up`), so a restart
between ops costs no failed op.

Bounds: ``timeout`` (default 0.5 s) bounds a call as a whole, whatever the server does: the
wait for a pooled connection, connecting and the op's statements end together, ``timeout``
after the call began, or after the last call that succeeded while it waited for its turn if
that is later. So a call that finds every connection busy waits as long as ops keep succeeding
(load), and behind a frozen server at most ``timeout`` past its start or the freeze, however
long the queue (see :mod:`floodwall.stores._turns`). Until the server has answered once, calls
get ``COLD_TIMEOUT`` (2 s) instead, their wait for a connection included: a process's first
connections on a busy machine are slow, not an outage.

* On the server, ``statement_timeout`` (the timeout) cancels a statement that runs too long, and
  ``idle_in_transaction_session_timeout`` ends a transaction whose client went away, so row
  locks never outlive their caller; a frozen server cancels the statement as soon as it resumes.
* On the client, a call still running at its deadline has its connection shut down (one
  watcher thread per store for sync callers, a timer in the event loop for async ones): the
  caller gets :class:`~floodwall.stores.StoreTimeoutError` at once, the connection is dropped,
  and the server rolls the transaction back when it sees the connection gone. Shutting the
  socket down, rather than cancelling the coroutine, keeps psycopg from waiting seconds on a
  cancel request to a server that does not answer.
* Connecting runs in a helper thread (at most ``pool_size``) so a connect to a frozen server
  costs the caller the timeout, not libpq's whole-second ``connect_timeout`` (2 s at least);
  TCP keepalives and ``tcp_user_timeout`` find a half-open connection.

After :meth:`PostgresStore.close` every call raises :class:`~floodwall.stores.StoreClosedError`;
:meth:`PostgresStore.aclose` only closes this loop's connections and the idle sync ones.
Migrations get ``MIGRATE_TIMEOUT_FACTOR`` times the timeout (DDL and the advisory lock).

Schema: the migrations in ``floodwall/stores/sql/postgresql/`` are applied on first use
(``auto_migrate``, default on; serialised across processes by an advisory lock) or by
:func:`floodwall.stores.migrate` during a deploy (then pass ``auto_migrate=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import select
import socket
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall.stores import _sql
from floodwall.stores._turns import Progress, Turns, deadline, take_turn, take_turn_async
from floodwall.stores.base import (
    Arg,
    Op,
    R,
    Store,
    StoreClosedError,
    StoreTimeoutError,
    StoreUnavailableError,
)

__all__ = ["PostgresStore"]

COLD_TIMEOUT = 2.0
"""Seconds the calls before the server first answers may take (libpq's own connect minimum)."""
MIGRATE_TIMEOUT_FACTOR = 20
"""A migration may take this many store timeouts (10 s by default): DDL, the advisory lock."""
_BUSY = "every connection busy, and none answered for {:g}s"
_BACKEND_ERRORS = (psycopg.Error, OSError)
"""What a client call raises (an op's own bug, even a ``ValueError``, propagates as it is)."""
_MIGRATE_LOCK = 0x666C6F6F64  # "flood": the advisory lock that serialises migrations
_Conn = psycopg.Connection[tuple[Any, ...]]
_AsyncConn = psycopg.AsyncConnection[tuple[Any, ...]]


def _lock_sql(table: str) -> str:
    return (
        f"INSERT INTO {table} AS t (key, value, expires_at) "  # noqa: S608 - allow-listed name
        "SELECT k, NULL, 0 FROM unnest(%s::text[]) AS k ORDER BY k "
        "ON CONFLICT (key) DO UPDATE SET expires_at = t.expires_at "
        "RETURNING key, value, expires_at, extract(epoch from clock_timestamp())::float8"
    )


def _update_sql(table: str) -> str:
    return f"UPDATE {table} SET value = %s, expires_at = %s WHERE key = %s"  # noqa: S608


def _delete_sql(table: str) -> str:
    return f"DELETE FROM {table} WHERE key = ANY(%s)"  # noqa: S608


def _purge_sql(table: str) -> str:
    return (
        f"DELETE FROM {table} WHERE expires_at < extract(epoch from clock_timestamp()) "  # noqa: S608
        f"AND key IN (SELECT key FROM {table} "
        "WHERE expires_at < extract(epoch from clock_timestamp()) LIMIT %s)"
    )


def _rows(raw: list[tuple[Any, ...]]) -> tuple[dict[str, tuple[bytes | None, float | None]], float]:
    rows = {row[0]: (row[1], row[2]) for row in raw}
    return rows, float(raw[0][3])


_poll = getattr(select, "poll", None)


def _hung_up(conn: _Conn | _AsyncConn) -> bool:
    """Whether the server spoke on an idle connection. Unprompted, it only does so to hang up (a
    FATAL error, then EOF), and a connection it hung up on would fail the next op; one
    non-blocking poll (about 1 µs, against an op's 350 µs) tells. A rare harmless message (a
    parameter change) just costs a reconnect."""
    if conn.closed:
        return True
    try:
        fd = conn.fileno()
        if _poll is None:  # Windows: select() takes sockets of any number
            return bool(select.select([fd], [], [], 0)[0])
        poller = _poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True


def _shut(conn: _Conn | _AsyncConn) -> None:
    """Shut the connection's socket down under a call blocked on it: the call fails at once
    (the server's reply can no longer arrive), and the connection is never reused."""
    with contextlib.suppress(OSError, ValueError, psycopg.Error):
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


def _left(until: float, clock: Clock) -> float:
    """Seconds from now to ``until`` on ``clock`` (0 once it passed)."""
    return max(0.0, until - clock.monotonic())


def _check_turn(until: float, clock: Clock, url: str, op: str) -> None:
    """Fail a call whose turn came after its deadline (its wait took the whole bound)."""
    if until <= clock.monotonic():
        raise StoreTimeoutError(url, op) from TimeoutError("the wait for a connection took it all")


class _Deadlines:
    """Sync calls' deadlines, kept by one daemon thread per store that shuts down the
    connection of a call still running at its deadline. At most ``pool_size`` calls are
    watched at once, so finding the next deadline scans a handful of entries."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._running: dict[int, tuple[float, _Conn]] = {}
        self._expired: set[int] = set()
        self._tokens = itertools.count()
        self._wakes_at = math.inf
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(self, conn: _Conn, deadline: float) -> int:
        token = next(self._tokens)
        with self._cond:
            if self._stopped:  # the store was closed meanwhile: this call ends now
                self._expired.add(token)
                _shut(conn)
                return token
            self._running[token] = (deadline, conn)
            if deadline < self._wakes_at:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="floodwall-pg-deadlines", daemon=True
                    )
                    self._thread.start()
                self._cond.notify()
        return token

    def release(self, token: int) -> bool:
        """Stop watching; True when the deadline passed and the connection was shut down."""
        with self._cond:
            if self._running.pop(token, None) is not None:
                return False
            self._expired.discard(token)
            return True

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = self._clock.monotonic()
                for token, (deadline, conn) in list(self._running.items()):
                    if deadline <= now:
                        del self._running[token]
                        self._expired.add(token)
                        _shut(conn)  # under the lock: the call cannot hand it back meanwhile
                self._wakes_at = min((d for d, _ in self._running.values()), default=math.inf)
                self._cond.wait(None if self._wakes_at == math.inf else self._wakes_at - now)

    def stop(self) -> None:
        """End every watched call now (the store is closing) and the thread."""
        with self._cond:
            self._stopped = True
            for token, (_, conn) in self._running.items():
                self._expired.add(token)
                _shut(conn)
            self._running.clear()
            self._cond.notify()


class _Pool:
    """At most ``size`` connections; idle ones are reused, failed ones closed."""

    def __init__(
        self, factory: Callable[[float], _Conn], size: int, url: str, clock: Clock
    ) -> None:
        self._factory = factory
        self._url = url
        self._idle: list[_Conn] = []
        self._slots = Turns(size)
        self._lock = threading.Lock()
        self.progress = Progress(clock)
        self.closed = False

    @contextlib.contextmanager
    def connection(
        self, bound: float | None = None, op: str = "connect"
    ) -> Iterator[tuple[_Conn, float]]:
        """A connection and the monotonic deadline of the call that asked for it: its turn
        waited for, and the deadline set, by the rules of :mod:`floodwall.stores._turns` (the
        wait counts in ``bound`` unless calls succeeded meanwhile); a new connection (when no
        idle one is left) is made by that deadline. ``None``: no bound."""
        if self.closed:
            raise StoreClosedError(self._url, op)
        began = self.progress.clock.monotonic()
        if bound is None:
            take_turn(self._slots, math.inf, self.progress)  # no bound: as long as it takes
        elif not take_turn(self._slots, bound, self.progress, cold=bound):
            raise StoreTimeoutError(self._url, op) from TimeoutError(_BUSY.format(bound))
        until = math.inf if bound is None else deadline(began, bound, self.progress)
        conn: _Conn | None = None
        try:
            _check_turn(until, self.progress.clock, self._url, op)
            while True:
                with self._lock:
                    conn = self._idle.pop() if self._idle else None
                if conn is None or not _hung_up(conn):
                    break
                conn.close()
            if conn is None:
                conn = self._factory(until)
            yield conn, until
            self.progress.succeeded()
        except BaseException:
            if conn is not None:
                conn.close()
                conn = None
            raise
        finally:
            if conn is not None:
                if not self.closed and conn.info.transaction_status == TransactionStatus.IDLE:
                    with self._lock:
                        self._idle.append(conn)
                else:
                    conn.close()
            self._slots.release()

    def close(self) -> None:
        self.closed = True
        self.close_idle()

    def close_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _AsyncPool:
    """:class:`_Pool` for one event loop."""

    def __init__(
        self, url: str, options: dict[str, Any], size: int, redacted: str, clock: Clock
    ) -> None:
        self._url = url
        self._redacted = redacted
        self._options = options
        self._idle: list[_AsyncConn] = []
        self._slots = asyncio.Semaphore(size)
        self.progress = Progress(clock)
        self.closed = False

    @contextlib.asynccontextmanager
    async def connection(
        self, bound: float | None = None, op: str = "connect"
    ) -> AsyncIterator[tuple[_AsyncConn, float]]:
        """:meth:`_Pool.connection` for async callers (cancelling a connect is safe)."""
        if self.closed:
            raise StoreClosedError(self._redacted, op)
        clock = self.progress.clock
        began = clock.monotonic()
        if bound is None:
            await self._slots.acquire()
        elif not await take_turn_async(self._slots, bound, self.progress, cold=bound):
            raise StoreTimeoutError(self._redacted, op) from TimeoutError(_BUSY.format(bound))
        until = math.inf if bound is None else deadline(began, bound, self.progress)
        conn: _AsyncConn | None = None
        try:
            _check_turn(until, clock, self._redacted, op)
            conn = self._idle.pop() if self._idle else None
            while conn is not None and _hung_up(conn):
                await conn.close()
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                async with asyncio.timeout(None if until == math.inf else _left(until, clock)):
                    conn = await psycopg.AsyncConnection.connect(self._url, **self._options)
            yield conn, until
            self.progress.succeeded()
        except BaseException:
            if conn is not None:
                await conn.close()
                conn = None
            raise
        finally:
            if conn is not None:
                if not self.closed and conn.info.transaction_status == TransactionStatus.IDLE:
                    self._idle.append(conn)
                else:
                    await conn.close()
            self._slots.release()

    async def close(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()


def _close_late(future: Future[_Conn]) -> None:
    """A connect the caller stopped waiting for: close what it made, if anything."""
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def _server_bounds(url: str, options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """libpq options that bound what the server and the kernel do: statement and idle-in-
    transaction timeouts (in front of the user's own ``options``), TCP keepalives and
    ``tcp_user_timeout``. The user's values win."""
    ms = max(1, round(1000 * timeout))
    given = {**conninfo_to_dict(url), **options}
    server = f"-c statement_timeout={ms} -c idle_in_transaction_session_timeout={10 * ms}"
    user = given.get("options")
    bounds: dict[str, Any] = {
        "keepalives": 1,
        "keepalives_idle": max(1, math.ceil(timeout)),
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": ms,
        "options": server if not user else f"{server} {user}",
    }
    return {name: value for name, value in bounds.items() if name == "options" or name not in given}


_CONNECTION_OPTIONS = frozenset(
    {"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"}
)
"""Keywords ``psycopg.connect`` takes besides libpq's connection parameters."""


def _connect_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` if psycopg takes every one: a connection keyword, or a libpq parameter
    (libpq's own parser decides); a misspelt option is refused here, naming it, not by the
    first connection."""
    params = {k: v for k, v in options.items() if k not in _CONNECTION_OPTIONS}
    try:
        make_conninfo("", **params)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            f"postgresql store options must be store, psycopg or libpq options: {str(exc).strip()}"
        ) from None
    return options


class PostgresStore(Store):
    """A store in PostgreSQL (see [Distributed state][guide-distributed]). ``connect_options`` go
    to psycopg. ``clock`` (monotonic seconds) times the calls' bounds: the wait for a
    connection's turn and each call's deadline."""

    timeout: float

    def __init__(
        self,
        url: str,
        *,
        prefix: str = defaults.STORE_PREFIX,
        timeout: float = defaults.STORE_TIMEOUT,
        pool_size: int = defaults.STORE_POOL_SIZE,
        auto_migrate: bool = True,
        purge_every: int = defaults.STORE_SQL_PURGE_EVERY,
        clock: Clock = SYSTEM_CLOCK,
        **connect_options: Any,
    ) -> None:
        super().__init__(url, prefix=prefix)
        validate.seconds("timeout", timeout, positive=True)
        validate.count("pool_size", pool_size)
        self.timeout = float(timeout)
        self.pool_size = pool_size
        self.auto_migrate = auto_migrate
        self.purge_every = purge_every
        self.clock = clock
        self._url = url
        self._options: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, math.ceil(timeout)),
            **_server_bounds(url, connect_options, self.timeout),
            **_connect_options(connect_options),
        }
        self._pool = _Pool(self._connect, pool_size, self.url, clock)
        self._deadlines = _Deadlines(clock)
        self._connector = ThreadPoolExecutor(pool_size, thread_name_prefix="floodwall-pg-connect")
        self._apools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AsyncPool] = (
            weakref.WeakKeyDictionary()
        )
        self._closed = False
        self._answered = False
        self._migrated = False
        self._ops = 0

    def _connect(self, until: float) -> _Conn:
        """A new connection by the monotonic ``until``; the attempt runs on in its thread if it
        is late, and what it makes then is closed."""
        try:
            future = self._connector.submit(psycopg.connect, self._url, **self._options)
        except RuntimeError as exc:  # the store was closed meanwhile
            raise StoreClosedError(self.url, "connect") from exc
        try:
            return future.result(timeout=None if until == math.inf else _left(until, self.clock))
        except TimeoutError as exc:
            future.add_done_callback(_close_late)
            raise StoreTimeoutError(self.url, "connect") from exc

    def _apool(self) -> _AsyncPool:
        if self._closed:
            raise StoreClosedError(self.url, "connect")
        loop = asyncio.get_running_loop()
        pool = self._apools.get(loop)
        if pool is None:
            pool = self._apools[loop] = _AsyncPool(
                self._url, self._options, self.pool_size, self.url, self.clock
            )
        return pool

    def _failure(self, exc: BaseException, op: str, expired: bool) -> StoreUnavailableError:
        if self._closed:
            error: StoreUnavailableError = StoreClosedError(self.url, op)
        elif expired or isinstance(exc, TimeoutError | psycopg.errors.QueryCanceled):
            error = StoreTimeoutError(self.url, op)
        else:
            error = StoreUnavailableError(self.url, op)
        error.__cause__ = exc
        return error

    def _bound(self) -> float:
        """Seconds a call may take: the timeout, or :data:`COLD_TIMEOUT` until the server has
        answered once (the first connections of a process, on a busy machine, are no outage)."""
        return self.timeout if self._answered else max(self.timeout, COLD_TIMEOUT)

    @contextlib.contextmanager
    def _bounded(self, op: str, timeout: float | None = None) -> Iterator[_Conn]:
        """A pooled connection whose use ends by the deadline (see
        :mod:`floodwall.stores.postgres`); every client error leaves as a typed store error."""
        bound = self._bound() if timeout is None else timeout
        expired = False
        try:
            with self._pool.connection(bound, op) as (conn, until):
                token = self._deadlines.watch(conn, until)
                try:
                    yield conn
                    self._answered = True
                finally:
                    expired = self._deadlines.release(token)
        except StoreUnavailableError:
            raise
        except Exception as exc:
            if not (isinstance(exc, _BACKEND_ERRORS) or self._closed):
                raise
            raise self._failure(exc, op, expired) from exc

    @contextlib.asynccontextmanager
    async def _bounded_async(self, op: str) -> AsyncIterator[_AsyncConn]:
        """:meth:`_bounded` for async callers: the event loop's timer shuts the connection."""
        loop = asyncio.get_running_loop()
        bound = self._bound()
        shut: list[bool] = []

        def expire(conn: _AsyncConn) -> None:
            shut.append(True)
            _shut(conn)

        try:
            async with self._apool().connection(bound, op) as (conn, until):
                timer = loop.call_later(_left(until, self.clock), expire, conn)
                try:
                    yield conn
                    self._answered = True
                finally:
                    timer.cancel()
        except StoreUnavailableError:
            raise
        except Exception as exc:
            if not (isinstance(exc, _BACKEND_ERRORS) or self._closed):
                raise
            raise self._failure(exc, op, bool(shut)) from exc

    # -- schema ---------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply the migrations this database lacks (under an advisory lock); return them."""
        bound = MIGRATE_TIMEOUT_FACTOR * self.timeout
        with self._bounded("migrate", bound) as conn, conn.transaction():
            conn.execute(f"SET LOCAL statement_timeout = {round(1000 * bound)}")
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {_sql.SCHEMA_TABLE} (version INTEGER PRIMARY KEY,"
                " name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            cursor = conn.execute(f"SELECT version FROM {_sql.SCHEMA_TABLE}")  # noqa: S608
            done = {row[0] for row in cursor.fetchall()}
            applied = []
            for migration in _sql.migrations("postgresql"):
                if migration.version not in done:
                    for statement in migration.statements:
                        conn.execute(statement.encode())
                    conn.execute(
                        f"INSERT INTO {_sql.SCHEMA_TABLE} (version, name) VALUES (%s, %s)",  # noqa: S608
                        (migration.version, migration.name),
                    )
                    applied.append(migration.version)
        self._migrated = True
        return applied

    # -- the interface --------------------------------------------------------------------

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        if self.auto_migrate and not self._migrated:
            self.migrate()
        keys = self.keys(op, key)
        table = _sql.table(op)
        with self._bounded(op.script) as conn:
            with conn.transaction():
                rows, now = _rows(conn.execute(_lock_sql(table), (keys,)).fetchall())
                writes, result = op.step(_sql.records(keys, rows, now), now, args)
                upserts, deletes = _sql.plan(keys, rows, writes)
                for upsert in upserts:
                    conn.execute(_update_sql(table), upsert)
                if deletes:
                    conn.execute(_delete_sql(table), (deletes,))
            self._ops += 1
            if self._ops % self.purge_every == 0:
                for name in _sql.TABLES.values():
                    conn.execute(_purge_sql(name), (defaults.STORE_SQL_PURGE_BATCH,))
        return result

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        if self.auto_migrate and not self._migrated:
            await asyncio.to_thread(self.migrate)
        keys = self.keys(op, key)
        table = _sql.table(op)
        async with self._bounded_async(op.script) as conn:
            async with conn.transaction():
                cursor = await conn.execute(_lock_sql(table), (keys,))
                rows, now = _rows(await cursor.fetchall())
                writes, result = op.step(_sql.records(keys, rows, now), now, args)
                upserts, deletes = _sql.plan(keys, rows, writes)
                for upsert in upserts:
                    await conn.execute(_update_sql(table), upsert)
                if deletes:
                    await conn.execute(_delete_sql(table), (deletes,))
            self._ops += 1
            if self._ops % self.purge_every == 0:
                for name in _sql.TABLES.values():
                    await conn.execute(_purge_sql(name), (defaults.STORE_SQL_PURGE_BATCH,))
        return result

    def purge_expired(self) -> int:
        """Delete up to ``STORE_SQL_PURGE_BATCH`` expired rows per table; return how many."""
        removed = 0
        with self._bounded("purge") as conn:
            for name in _sql.TABLES.values():
                cursor = conn.execute(_purge_sql(name), (defaults.STORE_SQL_PURGE_BATCH,))
                removed += cursor.rowcount
        return removed

    def ping(self) -> None:
        with self._bounded("ping") as conn:
            conn.execute("SELECT 1")

    async def ping_async(self) -> None:
        async with self._bounded_async("ping") as conn:
            await conn.execute("SELECT 1")

    def close(self) -> None:
        self._closed = True
        self._pool.close()
        self._deadlines.stop()
        self._connector.shutdown(wait=False, cancel_futures=True)

    async def aclose(self) -> None:
        self._pool.close_idle()
        pool = self._apools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()
