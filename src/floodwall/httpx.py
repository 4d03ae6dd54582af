"""httpx transports that put every request through its dependency's policies.

::

    import httpx
    from floodwall.httpx import AsyncResilientTransport

    transport = AsyncResilientTransport(registry=registry, routes={"payments.internal": "payments"})
    client = httpx.AsyncClient(transport=transport)

:class:`ResilientTransport` (sync) and :class:`AsyncResilientTransport` wrap any httpx transport
(default: ``httpx.HTTPTransport()`` / ``httpx.AsyncHTTPTransport()``). Per request they pick the
policy by host and path, send the wire headers (deadline left minus the margin, retry marker,
priority), bound each attempt to the time left, and classify the answer for the breaker and the
retry: 5xx/408/429 answers and connect errors, read timeouts and broken connections are failures;
only idempotent methods and requests carrying an ``Idempotency-Key`` are retried (connect errors
always: nothing was sent). When the policy gives up, the caller gets the last failed response or
the httpx exception, as without the transport; floodwall rejections (an open breaker, the
deadline) raise as themselves. A fallback value of the policy comes back as a ``200`` JSON
response marked ``X-Degraded``. See :mod:`floodwall.integrations._outbound` for the rules.

Request bodies must be re-readable to be retried (bytes, str, files; not generators).
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable
from functools import partial
from typing import Any, Unpack

from floodwall._core.extras import missing_extra

try:
    import httpx
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.httpx", "httpx") from _missing

from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.drivers import drive_async, drive_sync
from floodwall._core.policy import Policy
from floodwall._core.steps import CALL, Either, Step
from floodwall.integrations._faults import Fault, Faults, as_faults
from floodwall.integrations._outbound import Call, Outbound, OutboundOptions
from floodwall.integrations._wire import DEGRADED

__all__ = ["AsyncFaultTransport", "AsyncResilientTransport", "FaultTransport", "ResilientTransport"]

_CONNECT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_TIMEOUT = httpx.TimeoutException
_BROKEN = (httpx.NetworkError, httpx.RemoteProtocolError)


def _begin(core: Outbound, request: httpx.Request) -> Call:
    url = request.url
    return core.begin(
        request.method, url.host, url.port, url.path, request.headers.get("idempotency-key")
    )


def _prepare(call: Call, request: httpx.Request) -> None:
    headers = request.headers
    for name, value in call.headers():
        headers[name] = value
    timeout = call.attempt_timeout()
    if timeout is not None:
        given = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {
            phase: timeout if given.get(phase) is None else min(given[phase], timeout)
            for phase in ("connect", "read", "write", "pool")
        }


def _attempt(call: Call, request: httpx.Request) -> Generator[Step, Any, httpx.Response]:
    """One attempt, for both transports: send (the driver's call: the inner transport), map
    httpx's errors to the attempt's failures, and read a failed answer's body before raising,
    so a retry does not hold its connection."""
    _prepare(call, request)
    try:
        response: httpx.Response = yield CALL
    except _CONNECT as exc:
        raise call.connect_error(exc) from None
    except _TIMEOUT as exc:
        raise call.timeout_error(exc) from None
    except _BROKEN as exc:
        raise call.io_error(exc) from None
    failure = call.check(response.status_code, response.headers.get, response)
    if failure is not None:
        yield Either(response.read, response.aread)
        raise failure
    return response


def _degraded(call: Call, request: httpx.Request, value: Any) -> httpx.Response:
    return httpx.Response(
        200,
        content=json.dumps(value).encode(),
        headers={"Content-Type": "application/json", DEGRADED: call.degraded_value()},
        request=request,
    )


class ResilientTransport(httpx.BaseTransport):
    """A sync httpx transport through floodwall (see [Integrations][guide-integrations]).

    ``ResilientTransport(transport=None, policy=None, *, registry=None, routes=None,
    margin=0.010, idempotent_methods=..., failure_statuses=..., admission=True,
    admission_ttl=1.0, clock=SYSTEM_CLOCK)``: the options of
    :class:`~floodwall.integrations._outbound.Outbound`.
    """

    def __init__(
        self,
        transport: httpx.BaseTransport | None = None,
        policy: Policy | None = None,
        **options: Unpack[OutboundOptions],
    ) -> None:
        self.core = Outbound(policy, **options)
        self.transport = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        call = _begin(self.core, request)
        send = partial(self.transport.handle_request, request)

        def attempt() -> httpx.Response:
            return drive_sync(_attempt(call, request), send)  # type: ignore[no-any-return]

        result = call.run(attempt)
        return result if isinstance(result, httpx.Response) else _degraded(call, request, result)

    def close(self) -> None:
        self.transport.close()


class AsyncResilientTransport(httpx.AsyncBaseTransport):
    """The async twin of :class:`ResilientTransport`, for ``httpx.AsyncClient``."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        policy: Policy | None = None,
        **options: Unpack[OutboundOptions],
    ) -> None:
        self.core = Outbound(policy, **options)
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call = _begin(self.core, request)
        send = partial(self.transport.handle_async_request, request)

        async def attempt() -> httpx.Response:
            return await drive_async(_attempt(call, request), send)  # type: ignore[no-any-return]

        result = await call.run_async(attempt)
        return result if isinstance(result, httpx.Response) else _degraded(call, request, result)

    async def aclose(self) -> None:
        await self.transport.aclose()


# -- fault injection (tests) -------------------------------------------------------------------


def _fault_answer(fault: Fault, request: httpx.Request) -> httpx.Response:
    if fault.kind == "connect":
        raise httpx.ConnectError("injected fault: connection refused", request=request)
    if fault.kind == "timeout":
        raise httpx.ReadTimeout("injected fault: no answer in time", request=request)
    if fault.kind == "disconnect":
        raise httpx.RemoteProtocolError("injected fault: server disconnected", request=request)
    return httpx.Response(
        fault.status,
        headers=[("Content-Type", "application/json"), *fault.headers],
        content=fault.body,
        request=request,
    )


class FaultTransport(httpx.BaseTransport):
    """A sync transport injecting :class:`~floodwall.integrations._faults.Fault` s in front of
    ``transport`` (default: a real ``httpx.HTTPTransport``); see :mod:`floodwall.testing`.
    Put it *inside* the resilient transport: ``ResilientTransport(FaultTransport(faults))``."""

    def __init__(
        self,
        faults: Faults | Iterable[Fault | None],
        transport: httpx.BaseTransport | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.faults = as_faults(faults)
        self.transport = transport if transport is not None else httpx.HTTPTransport()
        self.clock = clock

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        fault = self.faults.next()
        if fault is not None:
            if fault.kind != "latency":
                return _fault_answer(fault, request)
            self.clock.sleep(fault.delay)
        return self.transport.handle_request(request)

    def close(self) -> None:
        self.transport.close()


class AsyncFaultTransport(httpx.AsyncBaseTransport):
    """The ``httpx.AsyncClient`` twin of :class:`FaultTransport`."""

    def __init__(
        self,
        faults: Faults | Iterable[Fault | None],
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.faults = as_faults(faults)
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()
        self.clock = clock

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        fault = self.faults.next()
        if fault is not None:
            if fault.kind != "latency":
                return _fault_answer(fault, request)
            await self.clock.async_sleep(fault.delay)
        return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self.transport.aclose()
