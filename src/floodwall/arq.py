"""arq jobs under floodwall's policies: a job-function wrapper and an ``enqueue_job`` that
carries the retry marker.

::

    from floodwall.arq import TaskGuard, enqueue_job, func

    guard = TaskGuard(fw.CircuitBreaker("payments"), retry=fw.Retry("charge"))

    async def charge(ctx, order_id: str) -> dict: ...

    class WorkerSettings:
        functions = [func(charge, guard=guard)]

Each run goes through :class:`TaskGuard` (see :mod:`floodwall.integrations._tasks`): a refusal
(open breaker, rate limit, claim held elsewhere) is re-queued with ``Retry(defer=retry_after)``
instead of running; a failure is retried only when the guard's :class:`~floodwall.Retry`
grants it (arq itself retries no failure); a job run again after a worker died (arq re-runs a
job whose in-progress marker expired, ``job_timeout`` + 10 s later) replays its stored result
instead of repeating its side effect.

arq messages carry no headers, so floodwall keeps them in a small hash beside the job,
``floodwall:arq:<job id>``, written when the job is re-queued or enqueued through
:func:`enqueue_job` (merged: fields already there, the caller's own included, are kept) and
deleted when it finishes (as arq deletes its own retry counter; a day's
expiry covers a worker that died first).

**Deferrals are not tries.** arq counts every start of a job against ``max_tries`` (its
``arq:retry:<job id>`` counter, ``ctx["job_try"]``); a job that floodwall deferred did not run,
so the deferral gives its count back (``DECR`` in the same transaction that stores the headers):
``max_tries`` and ``job_try`` count runs only, and a long outage cannot make arq give up a job
that never ran. Deferrals are bounded by the guard's own ``max_defer`` (seconds deferred in
all, default 3600), retries of failures by its ``Retry`` (``attempts``) and by ``max_tries``;
:func:`func` sets ``max_tries`` to :data:`MAX_TRIES` unless told otherwise.

arq runs coroutines on one event loop per worker process: there is no prefork pool; run
several worker processes (one per core or host) for parallelism, and the guard's global limits
and idempotency hold across them.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, cast

from floodwall._core.extras import missing_extra

try:
    from arq.connections import ArqRedis
    from arq.constants import retry_key_prefix
    from arq.jobs import Job
    from arq.typing import WorkerCoroutine
    from arq.worker import Function, Retry
    from arq.worker import func as arq_func
    from redis.exceptions import RedisError
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.arq", "arq") from _missing

from floodwall.integrations._tasks import Delivery, Done, TaskGuard, outgoing_headers

__all__ = ["HEADERS", "MAX_TRIES", "TaskGuard", "enqueue_job", "func"]

HEADERS: Final = "floodwall:arq:"
"""Key prefix of the hash holding a job's floodwall headers."""
HEADERS_TTL: Final = 88_400
"""Seconds a job's headers are kept at most (arq keeps its retry counter as long); a job that
finishes deletes them."""
MAX_TRIES: Final = 1000
"""arq's ``max_tries`` for guarded functions unless given: a backstop behind the guard's
``Retry`` (it counts runs only: a deferral gives its try back)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def _headers(redis: ArqRedis, job_id: str) -> dict[str, str]:
    raw = await redis.hgetall(HEADERS + job_id)
    return {_text(name): _text(value) for name, value in raw.items()}


async def _forget(redis: ArqRedis, job_id: str) -> None:
    """Delete a finished job's headers (floodwall's and the caller's own), as arq deletes its
    retry counter (a failure here only leaves them to expire: the job's answer stands)."""
    with contextlib.suppress(RedisError, OSError, TimeoutError):
        await redis.delete(HEADERS + job_id)


async def _store(
    redis: ArqRedis, job_id: str, headers: dict[str, str], *, deferred: bool = False
) -> None:
    """Write a job's headers; for a deferral, give back the try arq counted when it started the
    job (its ``arq:retry:`` counter, incremented at each start: the job did not run)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(HEADERS + job_id, mapping=headers)  # type: ignore[arg-type]
        pipe.expire(HEADERS + job_id, HEADERS_TTL)
        if deferred:
            pipe.decr(retry_key_prefix + job_id)
        await pipe.execute()


def _guarded(
    guard: TaskGuard, coroutine: Callable[..., Awaitable[Any]], name: str
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(coroutine)
    async def run(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        redis: ArqRedis = ctx["redis"]
        job_id = str(ctx["job_id"])
        headers = await _headers(redis, job_id)
        delivery = Delivery.read(name, job_id, headers)

        async def body(*args: Any, **kwargs: Any) -> Any:
            return await coroutine(ctx, *args, **kwargs)

        try:
            outcome = await guard.run_async(delivery, body, args, kwargs)
        except Exception:  # the job fails for good: arq will not run it again
            if headers:
                await _forget(redis, job_id)
            raise
        if isinstance(outcome, Done):
            if headers:
                await _forget(redis, job_id)
            return outcome.value
        await _store(redis, job_id, outcome.headers, deferred=outcome.kind == "defer")
        raise Retry(defer=outcome.delay) from outcome.error

    return run


def func(
    coroutine: Callable[..., Awaitable[Any]],
    *,
    guard: TaskGuard,
    name: str | None = None,
    max_tries: int = MAX_TRIES,
    **options: Any,
) -> Function:
    """arq's ``func(coroutine, ...)`` whose runs go through ``guard``; ``options`` are arq's
    (``timeout``, ``keep_result``, …). ``max_tries`` counts runs of the job (a retry of a
    failure is one; a deferral is not), default :data:`MAX_TRIES`."""
    if not isinstance(guard, TaskGuard):
        raise TypeError(f"guard must be a TaskGuard, got {guard!r}")
    name = name or coroutine.__qualname__
    wrapped = cast(WorkerCoroutine, _guarded(guard, coroutine, name))
    return arq_func(wrapped, name=name, max_tries=max_tries, **options)


async def _merge(redis: ArqRedis, job_id: str, headers: Mapping[str, str]) -> list[str]:
    """Add ``headers`` to the job's hash without replacing a field it already has (``HSETNX``);
    the names of the fields added."""
    names = list(headers)
    async with redis.pipeline(transaction=True) as pipe:
        for name in names:
            pipe.hsetnx(HEADERS + job_id, name, headers[name])
        pipe.expire(HEADERS + job_id, HEADERS_TTL)
        added = await pipe.execute()
    return [name for name, new in zip(names, added, strict=False) if new]


async def enqueue_job(
    redis: ArqRedis,
    function: str,
    *args: Any,
    _headers: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> Job | None:
    """``redis.enqueue_job(function, *args, **kwargs)`` that also records the job's headers:
    the ambient retry marker (inside a retried job, or an HTTP request that arrived as a retry,
    so the job does not retry again) and the caller's own ``_headers``, which win over it.

    The headers are merged into the job's hash (``floodwall:arq:<job id>``): a field the hash
    already has (written by the caller before, or by an earlier enqueue of the same
    ``_job_id``) is kept, never replaced. When arq refuses the job (a job with that id exists:
    ``None``), the fields added for it are removed again, so the existing job is untouched."""
    if _headers is not None and not (
        isinstance(_headers, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in _headers.items())
    ):
        raise TypeError(f"_headers must be a mapping of str to str, got {_headers!r}")
    headers = {**outgoing_headers(), **(_headers or {})}
    if not headers:
        return await redis.enqueue_job(function, *args, **kwargs)
    job_id = str(kwargs.pop("_job_id", None) or uuid.uuid4().hex)
    added = await _merge(redis, job_id, headers)
    job = await redis.enqueue_job(function, *args, _job_id=job_id, **kwargs)
    if job is None and added:
        await redis.hdel(HEADERS + job_id, *added)
    return job
