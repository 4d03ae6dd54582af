"""A requests adapter that puts every request through its dependency's policies.

::

    import requests
    from floodwall.requests import ResilientAdapter

    session = requests.Session()
    adapter = ResilientAdapter(registry=registry, routes={"payments.internal": "payments"})
    session.mount("http://", adapter)
    session.mount("https://", adapter)

The same behaviour as :mod:`floodwall.httpx`: a :class:`requests.adapters.HTTPAdapter` whose
``send`` runs the request through the policy chosen by host and path, with the wire headers, a
per-attempt timeout no longer than the time left, answers and errors classified for breaker and
retry, and only idempotent methods or requests with an ``Idempotency-Key`` retried. Leave
urllib3's own retries off (``max_retries=0``, the default): floodwall retries. A fallback value
of the policy comes back as a ``200`` JSON response marked ``X-Degraded``.
"""

from __future__ import annotations

import json
from typing import Any, Unpack, cast
from urllib.parse import urlsplit

from floodwall._core.extras import missing_extra

try:
    import requests
    import urllib3.exceptions
    from requests.adapters import HTTPAdapter
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.requests", "requests") from _missing

from floodwall._core.policy import Policy
from floodwall.integrations._outbound import Call, Outbound, OutboundOptions
from floodwall.integrations._wire import DEGRADED

__all__ = ["ResilientAdapter"]

Timeout = float | tuple[float | None, float | None] | None


def _connect_failed(exc: requests.exceptions.ConnectionError) -> bool:
    """Whether the connection never opened (so nothing was sent)."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    reason = exc.args[0] if exc.args else None
    reason = getattr(reason, "reason", reason)
    return isinstance(reason, urllib3.exceptions.NewConnectionError)


def _shrink(timeout: Any, limit: float) -> Timeout:
    if timeout is None:
        return (limit, limit)
    if isinstance(timeout, tuple):
        connect, read = timeout
        return (
            limit if connect is None else min(connect, limit),
            limit if read is None else min(read, limit),
        )
    return min(float(timeout), limit)


class ResilientAdapter(HTTPAdapter):
    """``ResilientAdapter(policy=None, *, registry=None, routes=None, margin=0.010, …,
    adapter=None)``: the options of :class:`~floodwall.integrations._outbound.Outbound`;
    ``adapter`` is the ``HTTPAdapter`` that sends (default: a fresh one, pool as requests')."""

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        adapter: HTTPAdapter | None = None,
        **options: Unpack[OutboundOptions],
    ) -> None:
        super().__init__()
        self.core = Outbound(policy, **options)
        self.adapter = adapter if adapter is not None else HTTPAdapter()

    def send(  # noqa: PLR0917 - HTTPAdapter.send's signature, positional as requests calls it
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Timeout = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> requests.Response:
        parts = urlsplit(request.url or "")
        call = self.core.begin(
            request.method or "GET",
            parts.hostname or "",
            parts.port,
            parts.path or "/",
            request.headers.get("Idempotency-Key"),
        )
        inner = self.adapter

        options = {"stream": stream, "verify": verify, "cert": cert, "proxies": proxies}

        def attempt() -> requests.Response:
            return _attempt(call, inner, request, timeout, options)

        result = call.run(attempt)
        if isinstance(result, requests.Response):
            return result
        return _degraded(call, request, result)

    def close(self) -> None:
        self.adapter.close()
        super().close()


def _attempt(
    call: Call,
    inner: HTTPAdapter,
    request: requests.PreparedRequest,
    timeout: Timeout,
    options: dict[str, Any],
) -> requests.Response:
    for name, value in call.headers():
        request.headers[name] = value
    left = call.attempt_timeout()
    if left is not None:
        timeout = _shrink(timeout, left)
    try:
        response = inner.send(request, timeout=cast(Any, timeout), **options)
    except requests.exceptions.ConnectionError as exc:
        if _connect_failed(exc):
            raise call.connect_error(exc) from None
        raise call.io_error(exc) from None
    except requests.exceptions.Timeout as exc:
        raise call.timeout_error(exc) from None
    except requests.exceptions.ChunkedEncodingError as exc:
        raise call.io_error(exc) from None
    failure = call.check(response.status_code, response.headers.get, response)
    if failure is not None:
        _ = response.content  # read the body: a retry must not hold the connection
        raise failure
    return response


def _degraded(call: Call, request: requests.PreparedRequest, value: Any) -> requests.Response:
    response = requests.Response()
    response.status_code = 200
    response._content = json.dumps(value).encode()
    response.headers.update({"Content-Type": "application/json", DEGRADED: call.degraded_value()})
    response.request = request
    response.url = request.url or ""
    response.encoding = "utf-8"
    return response
