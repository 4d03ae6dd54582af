"""``redis://``, ``rediss://``, ``redis+cluster://``: records in Redis, Valkey or Redis Cluster.

Each :class:`~floodwall.stores.Op` is its Lua script ``lua/<op.script>.lua``, read from the
package once per process (``importlib.resources``) and called by SHA: ``EVALSHA``, and on
``NOSCRIPT`` (a restarted server, a new cluster node, ``SCRIPT FLUSH``) one ``EVAL`` with the
source, which runs the op and caches the script on that node. One round trip per decision.

Why not redis-py's ``register_script``, which does the same: measured
(``benchmarks/distributed.py --scripts``, docs/distributed.md), the store's sync op takes 0.81 x
the time of a bare ``register_script`` call (its one command is written straight on a pooled
connection, :func:`_execute`), and its async op 0.87-0.92 x the time of the same store op
sending the script by ``register_script`` (:func:`_execute_async`). On a cluster,
``register_script`` answers ``NOSCRIPT`` with ``SCRIPT LOAD`` on *every* primary, so with one
master down a node that lost its scripts could not run them at all; the store's ``EVAL`` goes to
the key's node only (``tests/integration/test_store_freeze.py``).

Keys: ``<prefix>{<key>}<suffix>``; the ``{key}`` hash tag puts every record of one op in one
cluster slot. Time inside scripts comes only from the server (``TIME``, ``PX``/``PTTL``).

URLs:

* ``redis://[[user]:password@]host[:port][/db]`` and ``rediss://…`` (TLS), with redis-py's
  query options (``?ssl_cert_reqs=none``…), and ``unix:///path/redis.sock``;
* ``redis+cluster://[[user]:password@]host:port[,host:port…]`` and ``rediss+cluster://…``: any
  reachable node(s) of the cluster; the client discovers the rest.

Clients: one sync client (thread-safe, pooled), and one async client per running event loop
(made on first use; close it with ``await store.aclose()`` in that loop). At most
``max_connections`` (default 50) ops (``apply_async``) run at once per event loop, so they hold
at most that many connections (per node on a cluster); further ops wait their turn. Streams
(:mod:`floodwall.stores.streams`) use the same client beside them.

Bounds: ``timeout`` (default ``STORE_TIMEOUT`` = 0.5 s) bounds each call as a whole, once the
store has answered: taking a connection (a reconnect and its handshake), the command, the retry
below, and on a cluster the topology refresh redis-py runs inside a command, all within one
deadline (sync: :mod:`floodwall.stores._redis_deadline` gives the clients connections whose
connects and reads take what is left of it; async: ``asyncio.timeout`` around the awaited call).
Until the store first answers, redis-py bounds each connect and read by ``timeout`` on its own
(a slow start on a busy machine is no outage). An async op that finds all ``max_connections``
busy waits for its turn as long as ops keep succeeding (load), and at most ``timeout`` once none
has for that long (a frozen server); the wait counts in the command's bound unless ops succeeded
meanwhile (see :mod:`floodwall.stores._turns`). A command that times
out is never retried (a frozen server would double the wait) and raises
:class:`~floodwall.stores.StoreTimeoutError`; one that failed on a dead connection (a restarted
server leaves dead pooled sockets, a cluster failover moves a slot) is retried once on a fresh
connection, within the same deadline; then the store raises
:class:`~floodwall.stores.StoreUnavailableError`. redis-py's own retries are off, so these are the
only ones. After :meth:`RedisStore.close`, every call raises
:class:`~floodwall.stores.StoreClosedError`, including those whose connection was closed under them;
:meth:`RedisStore.aclose` only lets go of this loop's client and the sync one.

Persistence: when an :class:`~floodwall.Idempotency` uses the store, its first connection asks
the server (``CONFIG GET save appendonly``, every primary of a cluster) whether records survive
a restart; with neither RDB snapshots nor an AOF it logs a warning and emits a
``"store_volatile"`` event. ``check_persistence=False`` turns the check off (a server whose
``CONFIG`` is disabled is logged as unknown, never failed).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import math
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from importlib import resources
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.cluster
import redis.connection
import redis.retry
from redis.backoff import NoBackoff
from redis.exceptions import ClusterDownError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import Event, Listeners
from floodwall.stores._redis_deadline import begin, bounded_class, end, within
from floodwall.stores._turns import Progress, deadline, take_turn_async
from floodwall.stores.base import (
    Arg,
    Op,
    R,
    Store,
    StoreClosedError,
    StoreTimeoutError,
    StoreUnavailableError,
)

__all__ = ["RedisStore", "Script", "load_script", "volatile"]

log = logging.getLogger("floodwall.stores")

_TIMEOUTS = (RedisTimeoutError, TimeoutError)
"""A command that ran out of time (``socket.timeout`` is ``TimeoutError``): never retried."""
_RETRIED = (RedisConnectionError, ClusterDownError, ConnectionError)
"""A command that failed on a dead connection: retried once, on a fresh one."""
_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}
_CONNECTIONS: dict[str, type[Any]] = {
    "rediss": redis.connection.SSLConnection,
    "unix": redis.connection.UnixDomainSocketConnection,
}
"""The sync connection class a single-node URL's scheme takes (else ``Connection``)."""


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script of the package: its ``name``, ``source`` and SHA1 (what ``EVALSHA`` takes)."""

    name: str
    source: str
    sha: str


@cache
def load_script(name: str) -> Script:
    """``floodwall/stores/lua/<name>.lua``, read once per process."""
    try:
        source = resources.files("floodwall.stores").joinpath("lua", f"{name}.lua").read_text()
    except FileNotFoundError:
        raise ConfigError(f"no Lua script {name!r} in floodwall/stores/lua/") from None
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())  # noqa: S324 - Redis's id


def _execute(pool: Any, *command: Any) -> Any:
    """One command on a connection of a single-node client's ``pool``, retried once on a fresh
    connection when the pooled one was dead (never after a timeout), with none of
    ``execute_command``'s per-call bookkeeping (observability hooks, closures): about 4 µs less
    per decision, which on a ~50 µs loopback round trip is what separates a decision from a raw
    ``EVALSHA``."""
    conn = pool.get_connection()
    try:
        try:
            conn.send_command(*command)
            return conn.read_response()
        except _TIMEOUTS:
            raise
        except _RETRIED:
            conn.disconnect()  # a dead pooled socket (a restarted server): one fresh try
            conn.send_command(*command)
            return conn.read_response()
    except ResponseError:
        raise  # a whole reply was read: the connection is still in step
    except BaseException:
        conn.disconnect()  # never hand back a connection with a reply half read
        raise
    finally:
        pool.release(conn)


def _retried(client: Any, *command: Any) -> Any:
    """One command on a cluster client, once more after a dead connection or a failover (the
    client has re-learnt the topology meanwhile), never after a timeout."""
    try:
        return client.execute_command(*command)
    except _TIMEOUTS:
        raise
    except _RETRIED:
        return client.execute_command(*command)


async def _execute_async(pool: Any, *command: Any) -> Any:
    """:func:`_execute` for an async single-node client (whose ``execute_command`` also awaits
    an observability hook per command)."""
    conn = await pool.get_connection()
    try:
        try:
            await conn.send_command(*command)
            return await conn.read_response()
        except _TIMEOUTS:
            raise
        except _RETRIED:
            await conn.disconnect()
            await conn.send_command(*command)
            return await conn.read_response()
    except ResponseError:
        raise
    except BaseException:
        await conn.disconnect(nowait=True)  # cancelled mid-reply: never reuse the connection
        raise
    finally:
        await pool.release(conn)


async def _retried_async(call: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """``await call(*args)`` on an async client, once more after a dead connection or a
    failover, never after a timeout (:func:`_retried`)."""
    try:
        return await call(*args)
    except _TIMEOUTS:
        raise
    except _RETRIED:
        return await call(*args)


async def _by_sha_async(
    send: Callable[..., Awaitable[Any]], script: Script, keys: list[str], args: Sequence[Arg]
) -> Any:
    """``EVALSHA`` through ``send`` (one command), and on ``NOSCRIPT`` one ``EVAL``: on a
    cluster both go to the key's node, where ``register_script`` would send ``SCRIPT LOAD`` to
    every primary (so a node that lost its scripts could not run them while any is down)."""
    try:
        return await send("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:  # a restarted server, a new node, SCRIPT FLUSH: run it by its source
        return await send("EVAL", script.source, len(keys), *keys, *args)


def volatile(config: dict[str, Any]) -> bool:
    """Whether a server with this ``CONFIG GET save appendonly`` reply keeps nothing across a
    restart: no RDB save points and no append-only file."""
    text = {_text(k): _text(v) for k, v in config.items()}
    return not text.get("save", "").strip() and text.get("appendonly", "no") != "yes"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class _Target:
    """What the URL says to connect to."""

    cluster: bool
    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    ssl: bool


def _parse_cluster(url: str) -> _Target:
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    nodes = []
    for item in hosts.split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"redis+cluster URL needs host:port[,host:port...], got {url!r}")
        nodes.append((host.strip("[]"), int(port)))
    return _Target(
        cluster=True,
        nodes=tuple(nodes),
        username=unquote(username) or None,
        password=unquote(password) or None,
        ssl=parts.scheme == "rediss+cluster",
    )


@cache
def _client_option_names() -> frozenset[str]:
    """The keywords a redis-py client takes: a plain client's, a cluster client's, an async
    client's, and those ``from_url`` hands on to its connection pool and connections."""
    names: set[str] = set()
    for init in (
        redis.Redis.__init__,
        redis.cluster.RedisCluster.__init__,
        redis.asyncio.Redis.__init__,
        redis.ConnectionPool.__init__,
        redis.connection.AbstractConnection.__init__,
    ):
        names.update(
            p.name
            for p in inspect.signature(init).parameters.values()
            if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
        )
    return frozenset(names - {"self"})


def _client_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` if redis-py's clients take every one of them: a misspelt option is refused
    here, naming it, not by the first connection (or never, for a cluster)."""
    unknown = sorted(set(options) - _client_option_names())
    if unknown:
        raise ConfigError(
            f"redis store options must be store or redis-py client options, got {unknown}"
        )
    return options


class RedisStore(Store):
    """A store on one Redis server or a Redis Cluster (see
    [Distributed state][guide-distributed]). ``clock`` (monotonic seconds) times an async
    call's bound (its wait for a turn on the connections and its deadline) and stamps events."""

    timeout: float

    def __init__(
        self,
        url: str,
        *,
        prefix: str = defaults.STORE_PREFIX,
        timeout: float = defaults.STORE_TIMEOUT,
        max_connections: int = defaults.STORE_REDIS_MAX_CONNECTIONS,
        check_persistence: bool = True,
        clock: Clock = SYSTEM_CLOCK,
        **client_options: Any,
    ) -> None:
        super().__init__(url, prefix=prefix)
        scheme = urlsplit(url).scheme
        if scheme not in _SCHEMES:
            raise ConfigError(f"url scheme must be one of {sorted(_SCHEMES)}, got {url!r}")
        validate.seconds("timeout", timeout, positive=True)
        self.timeout = float(timeout)
        self.max_connections = max_connections
        self.check_persistence = check_persistence
        self.clock = clock
        self.cluster = scheme.endswith("+cluster")
        self._url = url
        self._target = _parse_cluster(url) if self.cluster else None
        self._options = _client_options(client_options)
        self._lock = threading.Lock()
        self._closed = False
        self._progress = Progress(clock)
        """When an async op last succeeded: a turn is waited for as long as ops succeed."""
        self._answered = False
        """Whether a sync op succeeded: from then on each is bounded as a whole."""
        self._client: Any = None
        self._run: Any = None
        """How :meth:`apply` sends one command with the sync client (see :func:`_execute`)."""
        self._durable_for: list[tuple[str, Listeners]] = []
        self._checked = False
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._aready: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )
        self._aslots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._arunners: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, Callable[..., Awaitable[Any]]]
        ] = weakref.WeakKeyDictionary()

    # -- clients ------------------------------------------------------------------------

    def _common(self) -> dict[str, Any]:
        return {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
            **self._options,
        }

    def _make_client(self) -> Any:
        retry = redis.retry.Retry(NoBackoff(), 0)  # the store retries, once, what may be retried
        if self._target is None:
            # connects and reads keep to each call's deadline (see _redis_deadline)
            base = _CONNECTIONS.get(urlsplit(self._url).scheme, redis.connection.Connection)
            return redis.Redis.from_url(
                self._url, retry=retry, connection_class=bounded_class(base), **self._common()
            )
        target = self._target
        base = redis.connection.SSLConnection if target.ssl else redis.connection.Connection
        return redis.cluster.RedisCluster(
            startup_nodes=[
                redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
                for host, port in target.nodes
            ],
            username=target.username,
            password=target.password,
            ssl=target.ssl,
            retry=retry,
            connection_class=bounded_class(base),
            **self._common(),
        )

    def _make_async_client(self) -> Any:
        retry = redis.asyncio.retry.Retry(NoBackoff(), 0)
        if self._target is None:
            # ops queue for a free connection on the store's own semaphore (_slots), not in
            # redis-py's BlockingConnectionPool, whose condition costs ~7 µs per command
            pool = redis.asyncio.ConnectionPool.from_url(self._url, retry=retry, **self._common())
            return redis.asyncio.Redis.from_pool(pool)
        target = self._target
        nodes = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in target.nodes]
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=nodes,
            username=target.username,
            password=target.password,
            ssl=target.ssl,
            retry=retry,
            max_connections=self.max_connections,
            **self._common(),
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (every call then raises ``StoreClosedError``)."""
        return self._closed

    def error_for(self, exc: BaseException, op: str) -> StoreUnavailableError:
        """The typed store error for a client's ``exc`` during ``op`` (its cause is ``exc``):
        closed, timed out, or unavailable."""
        if self._closed:
            error: StoreUnavailableError = StoreClosedError(self.url, op)
        elif isinstance(exc, _TIMEOUTS):
            error = StoreTimeoutError(self.url, op)
        else:
            error = StoreUnavailableError(self.url, op)
        error.__cause__ = exc
        return error

    def client(self) -> Any:
        """The sync redis-py client (made on first use)."""
        client = self._client
        if client is None:
            with self._lock:
                if self._closed:
                    raise StoreClosedError(self.url, "connect")
                if self._client is None:
                    try:
                        self._client = self._make_client()
                    except Exception as exc:
                        raise self.error_for(exc, "connect") from exc
                client = self._client
        if not self._checked and self._durable_for:
            self._check_persistence(client)
        return client

    def _runner(self) -> Any:
        """Make the sync client if need be, and how :meth:`apply` sends one command with it."""
        client = self.client()
        run = (
            partial(_retried, client) if self.cluster else partial(_execute, client.connection_pool)
        )
        self._run = run
        return run

    async def async_client(self) -> Any:
        """The running event loop's async redis-py client (made on first use).

        A cluster client learns the topology before its first command: commands racing a
        client's lazy discovery can find their connection closed under them (and redis-py then
        retries them, which would run a script twice).
        """
        if self._closed:
            raise StoreClosedError(self.url, "connect")
        loop = asyncio.get_running_loop()
        ready = self._aready.get(loop)
        if ready is not None and ready.done() and (ready.cancelled() or ready.exception()):
            ready, failed = None, self._aclients.pop(loop, None)  # never learnt the topology
            if failed is not None:
                await failed.aclose()
        if ready is None:
            client = self._aclients[loop] = self._make_async_client()
            ready = self._aready[loop] = loop.create_task(self._initialize(client))
        await asyncio.shield(ready)
        return self._aclients[loop]

    async def _async_runner(
        self, name: str
    ) -> Callable[[list[str], Sequence[Arg]], Awaitable[Any]]:
        """How :meth:`apply_async` runs the script ``name`` on this loop's client (made once
        per loop and script): :func:`_by_sha_async` over :func:`_execute_async` on one server,
        over the client's ``execute_command`` (retried once) on a cluster. Once the store has
        answered, making a loop's client (a cluster learns its topology first) is bounded by
        the store's timeout too."""
        loop = asyncio.get_running_loop()
        runners = self._arunners.get(loop)
        run = None if runners is None else runners.get(name)
        if run is None:
            warm = self._progress.at != -math.inf
            async with asyncio.timeout(self.timeout if warm else None):
                client = await self.async_client()
            send = (
                partial(_retried_async, client.execute_command)
                if self.cluster
                else partial(_execute_async, client.connection_pool)
            )
            run = partial(_by_sha_async, send, load_script(name))
            self._arunners.setdefault(loop, {})[name] = run
        return run

    async def _initialize(self, client: Any) -> None:
        if self.cluster:
            await client.initialize()
        if not self._checked and self._durable_for:
            await self._check_persistence_async(client)

    # -- persistence ----------------------------------------------------------------------

    def expect_durable(self, name: str, listeners: Listeners) -> None:
        if self.check_persistence:
            self._durable_for.append((name, listeners))
            self._checked, self._run = False, None  # the next sync op asks the server

    def _check_persistence(self, client: Any) -> None:
        self._checked = True
        try:
            if self.cluster:
                replies = client.config_get("save", "appendonly", target_nodes=client.PRIMARIES)
                self._persistence(list(replies.values()))
            else:
                self._persistence([client.config_get("save", "appendonly")])
        except Exception as exc:  # noqa: BLE001 - a disabled CONFIG, a server away: unknown
            log.info("could not tell whether %s persists its records: %s", self.url, exc)

    async def _check_persistence_async(self, client: Any) -> None:
        self._checked = True
        try:
            if self.cluster:
                replies = await client.config_get(
                    "save", "appendonly", target_nodes=client.PRIMARIES
                )
                self._persistence(list(replies.values()))
            else:
                self._persistence([await client.config_get("save", "appendonly")])
        except Exception as exc:  # noqa: BLE001 - as in _check_persistence
            log.info("could not tell whether %s persists its records: %s", self.url, exc)

    def _persistence(self, configs: list[dict[str, Any]]) -> None:
        lost = sum(volatile(config) for config in configs)
        if not lost:
            return
        where = (
            f"{lost} of {len(configs)} primaries of {self.url} have"
            if self.cluster
            else f"the server {self.url} has"
        )
        reason = (
            f"{where} neither AOF nor RDB persistence: a restart loses every idempotency "
            "record, and completed calls run again"
        )
        for name, listeners in self._durable_for:
            log.warning("%s: %s (check_persistence=False silences this)", name, reason)
            if listeners:
                listeners.emit(
                    Event(
                        kind="store_volatile",
                        source="store",
                        name=name,
                        time=self.clock.monotonic(),
                        reason=reason,
                        figures={"store": self.url, "volatile_nodes": lost},
                    )
                )

    # -- the interface ------------------------------------------------------------------

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        script = load_script(op.script)
        keys = self.keys(op, key)
        try:
            # one deadline for the whole call: making the client, a reconnect and its handshake,
            # the command, the retry on a fresh connection, a cluster's topology refresh (see
            # _redis_deadline); until the store first answered, redis-py's step by step bounds
            # (a slow start is no outage); redis-py encodes every Arg as str() would
            token = begin(self.timeout if self._answered else math.inf)
            try:
                run = self._run or self._runner()
                try:
                    raw = run("EVALSHA", script.sha, len(keys), *keys, *args)
                except NoScriptError:
                    raw = run("EVAL", script.source, len(keys), *keys, *args)
            finally:
                end(token)
            self._answered = True
        except StoreUnavailableError:
            raise
        except Exception as exc:  # a closed socket can raise ValueError or AttributeError
            raise self.error_for(exc, op.script) from exc
        return op.parse(raw)

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        keys = self.keys(op, key)
        began = self.clock.monotonic()
        try:
            if self._closed:
                raise StoreClosedError(self.url, op.script)
            run = await self._async_runner(op.script)
            # at most max_connections ops in flight, the rest wait their turn: a busy store is
            # load, not an outage (redis-py's cluster client would fail them instead), but no
            # turn is waited for behind a server that answers nothing (see _turns)
            slots, progress = self._slots(), self._progress
            if not await take_turn_async(slots, self.timeout, progress):
                raise StoreTimeoutError(self.url, op.script) from TimeoutError(
                    f"every connection busy, and none answered for {self.timeout:g}s"
                )
            try:
                # the command as a whole (a reconnect, a cluster's topology refresh inside it),
                # once a call succeeded (the first connections are bounded step by step)
                cold = progress.at == -math.inf
                until = deadline(began, self.timeout, progress)
                async with asyncio.timeout(None if cold else until - self.clock.monotonic()):
                    raw = await run(keys, args)
            finally:
                slots.release()
            progress.succeeded()
        except StoreUnavailableError:
            raise
        except Exception as exc:
            # After a timeout, redis-py's async cluster client re-initialises and may close a
            # connection another command is still writing on ("'NoneType' object has no
            # attribute 'writelines'"): that command failed on the store, not in the caller.
            raise self.error_for(exc, op.script) from exc
        return op.parse(raw)

    def _slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        slots = self._aslots.get(loop)
        if slots is None:
            slots = self._aslots[loop] = asyncio.Semaphore(self.max_connections)
        return slots

    def ping(self) -> None:
        try:
            with within(self.timeout):
                self.client().ping()
        except StoreUnavailableError:
            raise
        except Exception as exc:
            raise self.error_for(exc, "ping") from exc

    async def ping_async(self) -> None:
        try:
            await (await self.async_client()).ping()
        except StoreUnavailableError:
            raise
        except Exception as exc:
            raise self.error_for(exc, "ping") from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._release()

    def _release(self) -> None:
        """Drop the sync client (a later call, unless closed, makes a new one)."""
        with self._lock:
            client, self._client, self._run = self._client, None, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        self._release()
        loop = asyncio.get_running_loop()
        self._arunners.pop(loop, None)
        client = self._aclients.pop(loop, None)
        ready = self._aready.pop(loop, None)
        if ready is not None and not ready.done():
            ready.cancel()
        if client is not None:
            await client.aclose()
