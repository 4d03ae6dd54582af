"""One deadline per store call on redis-py's sync clients.

The store's ``timeout`` bounds a call as a whole. redis-py's own bounds are per socket step:
``socket_connect_timeout`` per connect and ``socket_timeout`` per read. One store call can take
several steps that each wait: taking a pooled connection that must reconnect (the connect, then
the handshake's replies: ``AUTH``, ``CLIENT SETINFO``, ``SELECT``), the command's reply, the
store's one retry on a fresh connection after a dead one, and on a cluster the topology refresh
that redis-py runs inside the next command after a failure. Against a server that freezes or
slows down between two of those steps, each one costs up to a whole timeout (a first failing
call was seen at 1 292 ms on Redis and 1 012 ms on a Cluster, timeout 0.5 s).

:func:`bounded_class` returns a connection class (built on redis-py's own) whose connects and
reads take only what is left of the running call's deadline; :func:`begin` and :func:`end` (or
:func:`within` around a block) set that deadline for the calls made meanwhile. The deadline is
a :class:`~contextvars.ContextVar`, so each thread (and task) has its own. Without a deadline
the connection behaves exactly as redis-py's.

* A connect waits at most what is left (never more than its ``socket_connect_timeout``).
* A read waits at most what is left. While more than ``READ_SLACK`` of its ``socket_timeout`` is
  left (the common case: the reply of a command on a connected socket) the read keeps the
  socket's own timeout, which ends it by the deadline plus that slack at worst, and costs no
  extra system call; below that it passes the rest as its timeout (redis-py's ``timeout=`` of
  ``read_response``, which redis-py 8.2 has and 5.0 to 7.0 have not (5.0.8, 5.1.0, 5.2.1, 6.0.0,
  6.4.0 and 7.0.0 checked: a floor cannot buy it while arq caps redis-py below 6): there a read
  starts only while some of the deadline is left, and then waits up to ``socket_timeout``).
* A spent deadline leaves ``MIN_WAIT`` to each step, so a reply already received is still read,
  and anything else ends at once with redis-py's ``TimeoutError``, which the store raises as
  :class:`~floodwall.stores.StoreTimeoutError`.

Cost: starting and ending a deadline and the read's check add about 1.5 µs to a store call
(``timeit`` on the 2-core development machine under load: 0.6 µs for :func:`begin` and
:func:`end`, 0.9 µs for the read), against 60-90 µs for a loopback round trip.

Async calls need none of this: the store bounds the whole awaited call with ``asyncio.timeout``.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from collections.abc import Iterator
from contextvars import ContextVar, Token
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["MIN_WAIT", "READ_SLACK", "begin", "bounded_class", "end", "left", "within"]

MIN_WAIT = 0.001
"""Seconds a step still gets once the deadline is spent (reads what has already arrived)."""
READ_SLACK = 0.05
"""A read keeps its socket's timeout while more than ``1 - READ_SLACK`` of it is left."""

_UNTIL: ContextVar[float] = ContextVar("floodwall_redis_until", default=math.inf)


def begin(timeout: float) -> Token[float]:
    """Give this thread's (or task's) redis-py steps on :func:`bounded_class` connections a
    deadline ``timeout`` seconds from now (``math.inf``: none), until :func:`end` is called with
    the token returned. A deadline already running and sooner is kept. (Two calls rather than a
    context manager: this runs on every store call.)"""
    return _UNTIL.set(min(time.monotonic() + timeout, _UNTIL.get()))


def end(token: Token[float]) -> None:
    """End the deadline :func:`begin` started (the one before it holds again)."""
    _UNTIL.reset(token)


@contextlib.contextmanager
def within(timeout: float) -> Iterator[None]:
    """:func:`begin` and :func:`end` around a block."""
    token = begin(timeout)
    try:
        yield
    finally:
        end(token)


def left(configured: float | None) -> float | None:
    """What a step may wait now: ``configured`` (``None``: no bound) without a deadline,
    else the smaller of it and what is left of the deadline, at least ``MIN_WAIT``."""
    until = _UNTIL.get()
    if until == math.inf:
        return configured
    rest = max(until - time.monotonic(), MIN_WAIT)
    return rest if configured is None else min(rest, configured)


_MADE: dict[type[Any], type[Any]] = {}


def bounded_class(base: type[Any]) -> type[Any]:
    """A subclass of the redis-py connection class ``base`` whose connects and reads keep to
    the deadline :func:`begin` sets (one class per ``base``, made once)."""
    made = _MADE.get(base)
    if made is None:
        made = _MADE[base] = _bounded(base)
    return made


def _bounded(base: type[Any]) -> type[Any]:
    takes_timeout = "timeout" in inspect.signature(base.read_response).parameters
    read = base.read_response  # called directly: super() costs a lookup on every read
    get, now, inf = _UNTIL.get, time.monotonic, math.inf
    tighten_below = 1.0 - READ_SLACK

    class Bounded(base):  # type: ignore[misc]
        _floodwall_connect_timeout: float | None = None  # read before redis-py's __init__ sets it

        @property
        def socket_connect_timeout(self) -> float | None:
            return left(self._floodwall_connect_timeout)

        @socket_connect_timeout.setter
        def socket_connect_timeout(self, value: float | None) -> None:
            self._floodwall_connect_timeout = value

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            until = get()
            if until != inf and "timeout" not in kwargs:
                rest = until - now()
                own = self.socket_timeout
                if own is None or rest < tighten_below * own:
                    if takes_timeout:
                        kwargs["timeout"] = max(rest, MIN_WAIT)
                    elif rest <= 0:
                        self.disconnect()  # a reply may still come: never reuse the socket
                        raise RedisTimeoutError("the store's timeout is spent")
            return read(self, *args, **kwargs)

    Bounded.__name__ = Bounded.__qualname__ = f"Bounded{base.__name__}"
    return Bounded
