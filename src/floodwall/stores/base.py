"""The store interface: one atomic operation, run where the data lives.

A store holds small records under string keys, each with an optional expiry on the *store's*
clock (Redis's ``TIME``, PostgreSQL's ``clock_timestamp()``, the host's wall clock for SQLite, the
injected :class:`~floodwall.Clock` for memory). Everything a policy does with shared state is an
:class:`Op`: a named read-modify-write of the records under one logical key, run atomically by the
store in **one round trip** where the backend allows it:

* Redis / Redis Cluster: the op's Lua script ``floodwall/stores/lua/<op.script>.lua``, called by
  SHA (``EVALSHA``; on ``NOSCRIPT`` the source is sent once with ``EVAL``, which caches it on that
  node). Keys are ``<prefix>{<key>}<suffix>``: every record of one op shares the ``{hash tag}``,
  so multi-key ops work on a cluster.
* PostgreSQL / SQLite: :meth:`Op.step` in Python inside one transaction that holds the rows'
  locks (``INSERT … ON CONFLICT DO UPDATE … RETURNING`` takes the row lock on PostgreSQL,
  ``BEGIN IMMEDIATE`` the write lock on SQLite), on the table ``floodwall_<op.table>``.
* Memory: :meth:`Op.step` under the store's lock.

So an op is written twice, once in Lua and once as a pure Python :meth:`Op.step`, and the
contract tests (``tests/test_store_contract.py``) hold the two to the same behaviour on every
backend. Policies import ops and stores, never a client library.

Writing a new op (e.g. a GCRA limiter)::

    class Gcra(Op[tuple[bool, float]]):
        script = "gcra"                  # lua/gcra.lua: KEYS[1], ARGV = (emission_ms, burst_ms)
        table = "kv"                     # SQL table floodwall_kv
        suffixes = ("",)                 # one record; ("", ":prev") would give two, same tag

        def step(self, records, now, args):   # records[i] is a Record or None (absent/expired)
            ...                               # pure: no I/O, no clock but ``now`` (seconds)
            return [Record(b"...", now + ttl)], (allowed, retry_after)   # or KEEP / DELETE

        def parse(self, raw):            # the Lua reply -> the same value ``step`` returns
            ...

Arguments reach Lua as strings (``ARGV``); durations cross as integer milliseconds by
convention. Lua must take time from ``redis.call('TIME')`` or from Redis's own expiry
(``PX``/``PTTL``), never from an argument.

Sync and async: ``store.apply(op, key, args)`` blocks, ``await store.apply_async(op, key, args)``
does not; both exist on every store (like ``call``/``call_async`` on a policy). Async clients are
bound to the running event loop (one per loop, made on first use); close them with
``await store.aclose()`` in that loop, and the sync ones with ``store.close()``.

Every backend error surfaces as :class:`StoreUnavailableError` (``url`` without the password,
``op``, ``__cause__`` = the client's exception), wrapped once at the store's edge; no client
library exception reaches a caller, not even one raised by a connection closed under it.

Bounds: a server store's ``timeout`` bounds every call, whatever the server does (frozen, slow,
a half-open TCP connection); a call that runs out of it raises :class:`StoreTimeoutError`, which
a :class:`~floodwall.stores.StoreGuard` takes as proof enough that the store is down. After
``close()`` the store is closed for good: calls already running and every later one raise
:class:`StoreClosedError`, which guarded policies handle like any outage (``aclose()`` only
releases the running loop's connections).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Final, Generic, NamedTuple, TypeVar

from floodwall._core import validate
from floodwall._core.errors import ConfigError, FloodwallError
from floodwall._core.events import Listeners

__all__ = [
    "DELETE",
    "KEEP",
    "Arg",
    "Op",
    "Record",
    "Store",
    "StoreClosedError",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "Write",
    "redact",
]

R = TypeVar("R")

Arg = str | int | float | bytes
"""What an op takes as arguments (Lua receives each as a string)."""


class Record(NamedTuple):
    """A stored value and when it expires (seconds on the store's clock; ``None``: never).

    A tuple, like :class:`~floodwall.ratelimit.Decision`: an op reads one and writes one on
    every decision, and ``tuple.__new__(Record, (value, expires_at))`` builds it in C (0.5 µs
    against 1.5 µs for the frozen dataclass it was, ``benchmarks/million_keys.py``'s
    ``frequency`` case)."""

    value: bytes
    expires_at: float | None = None

    def alive(self, now: float) -> bool:
        return self.expires_at is None or self.expires_at > now


class _Keep:
    __slots__ = ()

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()
"""A write meaning "leave this record as it is"."""
DELETE: Final = None
"""A write meaning "remove this record"."""

Write = Record | _Keep | None
"""What :meth:`Op.step` returns per record: a new :class:`Record`, :data:`KEEP` or
:data:`DELETE`."""


class Op(ABC, Generic[R]):
    """An atomic read-modify-write on the records under one logical key.

    Class attributes: ``script`` names ``lua/<script>.lua``; ``table`` the SQL table family
    (``"kv"`` → ``floodwall_kv``, ``"idempotency"`` → ``floodwall_idempotency``); ``suffixes``
    the records the op touches, appended after the hash-tagged key (``KEYS[i]`` in Lua,
    ``records[i]`` in :meth:`step`).
    """

    script: str
    table: str = "kv"
    suffixes: tuple[str, ...] = ("",)

    @abstractmethod
    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], R]:
        """The op as a pure function: current records (``None``: absent or expired) and the
        store's ``now`` in seconds → one write per record and the result."""

    def step_one(self, record: Record | None, now: float, args: Sequence[Any]) -> tuple[Write, R]:
        """:meth:`step` on the one record of an op whose ``suffixes`` name one: its write and
        the result. What ``memory://`` calls per op; an op overrides it to skip the lists."""
        writes, result = self.step([record], now, args)
        return writes[0], result

    @abstractmethod
    def parse(self, raw: Any) -> R:
        """Turn the Lua script's reply into what :meth:`step` returns."""

    def __repr__(self) -> str:
        return f"<Op {self.script}>"


class StoreUnavailableError(FloodwallError):
    """A store could not do ``op``: ``StoreUnavailableError(url, op)``, the backend's exception
    in ``__cause__``.

    ``url`` never contains a password. Guarded policies turn this into their configured
    behaviour (``on_store_error``); unguarded code sees it instead of a client library's error.
    """

    args: tuple[str, str]

    def __init__(self, url: str, op: str) -> None:
        super().__init__(url, op)

    @property
    def url(self) -> str:
        """The store's URL, password removed."""
        return self.args[0]

    @property
    def op(self) -> str:
        """What the store was asked to do (an op's script name, ``"connect"``, ``"migrate"``)."""
        return self.args[1]

    def __str__(self) -> str:
        cause = self.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return f"store {self.url} unavailable during {self.op!r}{detail}"


class StoreTimeoutError(StoreUnavailableError):
    """The store did not answer ``op`` within its ``timeout``: a frozen or overloaded server,
    a half-open connection. Waiting longer would make the protection layer the failure."""


class StoreClosedError(StoreUnavailableError):
    """The store was closed (``close()``) before or while it ran ``op``."""


class StoreRecordTooLargeError(StoreUnavailableError):
    """The store cannot hold the one record ``op`` would write (``host://``'s records have a
    fixed size): that op failed, the store did not. Store guards answer the op by
    ``on_store_error`` but neither count it toward their breaker nor report an outage."""


_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@]*):[^@/]*@", re.IGNORECASE)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    return _PASSWORD.sub(r"\g<head>:***@", url)


class Store(ABC):
    """A place for shared records (see [Distributed state][guide-distributed]).

    ``url`` is the redacted URL, ``prefix`` the string every full key starts with.
    """

    url: str
    prefix: str
    timeout: float | None = None
    """Seconds that bound each call on a server (``None``: the store never waits on one)."""

    def __init__(self, url: str, *, prefix: str) -> None:
        validate.text("url", url)
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise ConfigError(f"prefix must be a string without braces, got {prefix!r}")
        self.url = redact(url)
        self.prefix = prefix
        self._keys: dict[tuple[tuple[str, ...], str], list[str]] = {}

    _KEYS_CACHED = 4096
    """Full key lists remembered (hot keys are built once; the table is dropped when full)."""

    def keys(self, op: Op[Any], key: str) -> list[str]:
        """The full keys ``op`` touches for the logical ``key``: ``<prefix>{<key>}<suffix>``."""
        cached = self._keys.get((op.suffixes, key))
        if cached is not None:
            return cached
        if not isinstance(key, str) or not key:
            raise ConfigError(f"key must be a non-empty string, got {key!r}")
        base = f"{self.prefix}{{{key}}}"
        built = [base + suffix for suffix in op.suffixes]
        if len(self._keys) >= self._KEYS_CACHED:
            self._keys.clear()
        self._keys[(op.suffixes, key)] = built
        return built

    @abstractmethod
    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        """Run ``op`` atomically on ``key``'s records; one round trip where the backend allows.

        Raises :class:`StoreUnavailableError` when the backend fails.
        """

    @abstractmethod
    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        """:meth:`apply` for async callers (never blocks the event loop)."""

    def ping(self) -> None:  # noqa: B027 - stores without a server are always reachable
        """Raise :class:`StoreUnavailableError` unless the backend answers."""

    async def ping_async(self) -> None:
        """:meth:`ping` for async callers."""
        self.ping()

    def expect_durable(self, name: str, listeners: Listeners) -> None:  # noqa: B027 - see below
        """Note that ``name``'s records must survive a server restart (idempotency).

        A store that can tell its server would lose them (a Redis with neither AOF nor RDB)
        logs a warning and emits a ``"store_volatile"`` event to ``listeners`` when it first
        connects; the others have nothing to check (docs/distributed.md says what each keeps).
        """

    def close(self) -> None:  # noqa: B027 - stores without connections have nothing to close
        """Close the store for good: calls running and later calls raise
        :class:`StoreClosedError`."""

    async def aclose(self) -> None:  # noqa: B027 - stores without connections keep none
        """Release the running event loop's async connections and the idle sync ones (at the
        end of a loop, of an async test); the store stays usable, :meth:`close` ends it."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
