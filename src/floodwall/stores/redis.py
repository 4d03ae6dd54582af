"""``redis://``, ``rediss://``, ``redis+cluster://``: records in Redis, Valkey or Redis Cluster.

Each :class:`~floodwall.stores.Op` is its Lua script ``lua/<op.script>.lua``, read from the
package once per process (``importlib.resources``) and called by SHA: ``EVALSHA``, and on
``NOSCRIPT`` (a restarted server, a new cluster node, ``SCRIPT FLUSH``) one ``EVAL`` with the
source, which runs the op and caches the script on that node. One round trip per decision.

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
(:mod:`floodwall.stores.streams`) use the same client beside them. ``timeout`` (default
``STORE_TIMEOUT`` = 0.5 s) bounds connecting and each command; a failed command is retried once
on a fresh connection (a restarted server leaves dead pooled sockets), then the store raises
:class:`~floodwall.stores.StoreUnavailableError`.
"""

from __future__ import annotations

import asyncio
import hashlib
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
import redis.retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from floodwall._core import defaults
from floodwall._core.errors import ConfigError
from floodwall.stores.base import Arg, Op, R, Store, StoreUnavailableError

__all__ = ["RedisStore", "Script", "load_script"]

_BACKEND_ERRORS = (RedisError, RedisClusterException, OSError)
_RETRIED = (RedisConnectionError, RedisTimeoutError, OSError)
"""What redis-py's ``Retry`` retries (a socket timeout is an ``OSError``)."""
_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}


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
    """One command on a connection of a single-node client's ``pool``, with the client's retry
    (once, on a fresh connection) and none of ``execute_command``'s per-call bookkeeping
    (observability hooks, closures): about 4 µs less per decision, which on a ~50 µs loopback
    round trip is what separates a decision from a raw ``EVALSHA``."""
    conn = pool.get_connection()
    try:
        try:
            conn.send_command(*command)
            return conn.read_response()
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


async def _execute_async(pool: Any, *command: Any) -> Any:
    """:func:`_execute` for an async single-node client (whose ``execute_command`` also awaits
    an observability hook per command)."""
    conn = await pool.get_connection()
    try:
        try:
            await conn.send_command(*command)
            return await conn.read_response()
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


async def _evalsha(
    run: Callable[..., Awaitable[Any]], script: Script, keys: list[str], args: Sequence[Arg]
) -> Any:
    try:
        return await run("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:  # a restarted server, a new node, SCRIPT FLUSH: run it by its source
        return await run("EVAL", script.source, len(keys), *keys, *args)


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


class RedisStore(Store):
    """A store on one Redis server or a Redis Cluster (see
    [Distributed state][guide-distributed])."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = defaults.STORE_PREFIX,
        timeout: float = defaults.STORE_TIMEOUT,
        max_connections: int = defaults.STORE_REDIS_MAX_CONNECTIONS,
        **client_options: Any,
    ) -> None:
        super().__init__(url, prefix=prefix)
        scheme = urlsplit(url).scheme
        if scheme not in _SCHEMES:
            raise ConfigError(f"url scheme must be one of {sorted(_SCHEMES)}, got {url!r}")
        if not timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.max_connections = max_connections
        self.cluster = scheme.endswith("+cluster")
        self._url = url
        self._target = _parse_cluster(url) if self.cluster else None
        self._options = client_options
        self._lock = threading.Lock()
        self._client: Any = None
        self._run: Any = None
        """How :meth:`apply` sends one command with the sync client (see :func:`_execute`)."""
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._aready: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )
        self._aslots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    # -- clients ------------------------------------------------------------------------

    def _common(self) -> dict[str, Any]:
        return {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
            **self._options,
        }

    def _make_client(self) -> Any:
        retry = redis.retry.Retry(NoBackoff(), 1)
        if self._target is None:
            return redis.Redis.from_url(self._url, retry=retry, **self._common())
        target = self._target
        return redis.cluster.RedisCluster(
            startup_nodes=[
                redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
                for host, port in target.nodes
            ],
            username=target.username,
            password=target.password,
            ssl=target.ssl,
            retry=retry,
            **self._common(),
        )

    def _make_async_client(self) -> Any:
        retry = redis.asyncio.retry.Retry(NoBackoff(), 1)
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

    def client(self) -> Any:
        """The sync redis-py client (made on first use)."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    try:
                        self._client = self._make_client()
                    except _BACKEND_ERRORS as exc:
                        raise StoreUnavailableError(self.url, "connect") from exc
                client = self._client
        return client

    def _runner(self) -> Any:
        """Make the sync client if need be, and how :meth:`apply` sends one command with it."""
        client = self.client()
        run = client.execute_command if self.cluster else partial(_execute, client.connection_pool)
        self._run = run
        return run

    async def async_client(self) -> Any:
        """The running event loop's async redis-py client (made on first use).

        A cluster client learns the topology before its first command: commands racing a
        client's lazy discovery can find their connection closed under them (and redis-py then
        retries them, which would run a script twice).
        """
        loop = asyncio.get_running_loop()
        ready = self._aready.get(loop)
        if ready is None:
            client = self._aclients[loop] = self._make_async_client()
            ready = self._aready[loop] = loop.create_task(self._initialize(client))
        await asyncio.shield(ready)
        return self._aclients[loop]

    async def _initialize(self, client: Any) -> None:
        if self.cluster:
            await client.initialize()

    # -- the interface ------------------------------------------------------------------

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        script = load_script(op.script)
        keys = self.keys(op, key)
        try:
            run = self._run or self._runner()
            # redis-py encodes every Arg (str, int, float, bytes) as str() would
            try:
                raw = run("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:
                raw = run("EVAL", script.source, len(keys), *keys, *args)
        except _BACKEND_ERRORS as exc:
            raise StoreUnavailableError(self.url, op.script) from exc
        return op.parse(raw)

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        script = load_script(op.script)
        keys = self.keys(op, key)
        try:
            client = await self.async_client()
            run = (
                client.execute_command
                if self.cluster
                else partial(_execute_async, client.connection_pool)
            )
            # at most max_connections ops in flight, the rest wait their turn: a busy store is
            # load, not an outage (redis-py's cluster client would fail them instead)
            async with self._slots():
                raw = await _evalsha(run, script, keys, args)
        except _BACKEND_ERRORS as exc:
            raise StoreUnavailableError(self.url, op.script) from exc
        except AttributeError as exc:
            if not self.cluster:
                raise
            # After a timeout, redis-py's async cluster client re-initialises and may close a
            # connection another command is still writing on ("'NoneType' object has no
            # attribute 'writelines'"): that command failed on the store, not in the caller.
            raise StoreUnavailableError(self.url, op.script) from exc
        return op.parse(raw)

    def _slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        slots = self._aslots.get(loop)
        if slots is None:
            slots = self._aslots[loop] = asyncio.Semaphore(self.max_connections)
        return slots

    def ping(self) -> None:
        try:
            self.client().ping()
        except _BACKEND_ERRORS as exc:
            raise StoreUnavailableError(self.url, "ping") from exc

    async def ping_async(self) -> None:
        try:
            await (await self.async_client()).ping()
        except _BACKEND_ERRORS as exc:
            raise StoreUnavailableError(self.url, "ping") from exc

    def close(self) -> None:
        with self._lock:
            client, self._client, self._run = self._client, None, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        self.close()
        loop = asyncio.get_running_loop()
        client = self._aclients.pop(loop, None)
        ready = self._aready.pop(loop, None)
        if ready is not None and not ready.done():
            ready.cancel()
        if client is not None:
            await client.aclose()
