"""An aiohttp client middleware that puts every request through its dependency's policies.

::

    import aiohttp
    from floodwall.aiohttp import ResilientMiddleware

    resilience = ResilientMiddleware(registry=registry, routes={"payments.internal": "payments"})
    async with aiohttp.ClientSession(middlewares=(resilience,)) as session:
        async with session.get("http://payments.internal/v1/balance") as response: ...

The same behaviour as :mod:`floodwall.httpx` (aiohttp >= 3.12, which added client
middlewares): policy by host and path, wire headers, per-attempt timeout from the time left,
answers and errors classified for breaker and retry, only idempotent methods or requests with
an ``Idempotency-Key`` retried. A failed answer's body is read before it is retried or handed
back, so a retry does not hold its connection. A fallback *value* of the policy cannot be turned
into an aiohttp response: it raises :class:`~floodwall.DegradedError` with the value as
``.value``; use a fallback that returns a response, or none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Unpack

from floodwall._core.extras import missing_extra

try:
    import aiohttp
    from multidict import CIMultiDict, CIMultiDictProxy
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.aiohttp", "aiohttp") from _missing

from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import DegradedError
from floodwall._core.policy import Policy
from floodwall.integrations._faults import Fault, Faults, as_faults
from floodwall.integrations._outbound import Call, Outbound, OutboundOptions

__all__ = ["FaultMiddleware", "ResilientMiddleware"]

_CONNECT = (aiohttp.ClientConnectorError, aiohttp.ClientProxyConnectionError)
_TIMEOUT = (asyncio.TimeoutError, aiohttp.ServerTimeoutError)
_BROKEN = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)


class ResilientMiddleware:
    """``ResilientMiddleware(policy=None, *, registry=None, routes=None, margin=0.010, …)``:
    the options of :class:`~floodwall.integrations._outbound.Outbound`. Pass it in
    ``ClientSession(middlewares=(...,))`` or per request."""

    def __init__(self, policy: Policy | None = None, **options: Unpack[OutboundOptions]) -> None:
        self.core = Outbound(policy, **options)

    async def __call__(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        url = request.url
        call = self.core.begin(
            request.method,
            url.host or "",
            url.explicit_port,
            url.path,
            request.headers.get("Idempotency-Key"),
        )

        async def attempt() -> aiohttp.ClientResponse:
            return await _attempt(call, request, handler)

        result = await call.run_async(attempt)
        if isinstance(result, aiohttp.ClientResponse):
            return result
        name = call.policy.name if call.policy is not None else "fallback"
        error = DegradedError(name, "a fallback value answered; aiohttp needs a response", None)
        error.value = result  # type: ignore[attr-defined]
        raise error


async def _attempt(
    call: Call, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    headers = request.headers
    for name, value in call.headers():
        headers[name] = value
    timeout = call.attempt_timeout()
    try:
        if timeout is None:
            response = await handler(request)
        else:
            async with asyncio.timeout(timeout):
                response = await handler(request)
    except _CONNECT as exc:
        raise call.connect_error(exc) from None
    except _TIMEOUT as exc:
        raise call.timeout_error(exc) from None
    except _BROKEN as exc:
        raise call.io_error(exc) from None
    failure = call.check(response.status, response.headers.get, response)
    if failure is not None:
        await response.read()
        raise failure
    return response


# -- fault injection (tests) -------------------------------------------------------------------


class FaultMiddleware:
    """A client middleware injecting :class:`~floodwall.integrations._faults.Fault` s (see
    :mod:`floodwall.testing`): list it *after* the :class:`ResilientMiddleware` in
    ``middlewares=`` so it runs inside. Status faults send the request, then replace the
    answer's status, headers and body (aiohttp has no public way to build a response)."""

    def __init__(
        self, faults: Faults | Iterable[Fault | None], *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.faults = as_faults(faults)
        self.clock = clock

    async def __call__(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        fault = self.faults.next()
        if fault is None:
            return await handler(request)
        if fault.kind == "latency":
            await self.clock.async_sleep(fault.delay)
            return await handler(request)
        if fault.kind == "connect":
            refused = ConnectionRefusedError(111, "injected fault: connection refused")
            raise aiohttp.ClientConnectorError(request.connection_key, refused)
        if fault.kind == "timeout":
            raise TimeoutError("injected fault: no answer in time")
        if fault.kind == "disconnect":
            raise aiohttp.ServerDisconnectedError("injected fault")
        response = await handler(request)
        await response.read()
        headers = CIMultiDict([("Content-Type", "application/json"), *fault.headers])
        headers["Content-Length"] = str(len(fault.body))
        response.status = fault.status
        response.reason = "Injected Fault"
        response._headers = CIMultiDictProxy(headers)  # no public setter: this is a test double
        response._body = fault.body
        return response
