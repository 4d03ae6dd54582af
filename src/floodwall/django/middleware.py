"""The inbound guard as Django middleware, for sync and async stacks (WSGI and ASGI).

A shell over :class:`~floodwall.integrations._inbound.InboundGuard`, the core the WSGI and ASGI
middleware share: the request becomes an ``Inbound``, the guard admits or refuses it, the view
runs under the admission (deadline, retry marker, priority) and reads it as
``request.floodwall``. List it first in ``MIDDLEWARE`` so refusals cost no other middleware.
The shedding ticket ends when the response is returned (a streaming body is sent afterwards).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from floodwall.django import guard as _guard
from floodwall.integrations._inbound import Admission, Captured, Inbound, Refusal
from floodwall.integrations._wire import IDEMPOTENT_REPLAYED

__all__ = ["FloodwallMiddleware"]

Response: TypeAlias = Any
"""A Django ``HttpResponseBase`` (Django ships no type information)."""


def _inbound(request: HttpRequest, wanted: frozenset[str] | None) -> Inbound:
    headers: dict[str, str] = {}
    for name, value in request.headers.items():
        lower = name.lower()
        if wanted is None or lower in wanted:
            headers[lower] = value
    return Inbound(request.method or "GET", request.path, headers, request.META.get("REMOTE_ADDR"))


def _answer(status: int, headers: list[tuple[str, str]], body: bytes) -> HttpResponse:
    response = HttpResponse(body, status=status)
    for name, value in headers:
        response[name] = value
    return response


def _captured(response: Response) -> Captured:
    if getattr(response, "streaming", False):
        body = b"".join(response.streaming_content)
    else:
        body = response.content
    return Captured(response.status_code, list(response.items()), body)


class FloodwallMiddleware:
    """``MIDDLEWARE = ["floodwall.django.middleware.FloodwallMiddleware", ...]``: the guard of
    ``settings.FLOODWALL_GUARD`` in front of every view."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.guard = _guard()
        self._wanted = self.guard.wanted_headers
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self._async:
            return self._acall(request)
        inbound = _inbound(request, self._wanted)
        admitted = self.guard.admit(inbound)
        if isinstance(admitted, Refusal):
            return _answer(admitted.status, admitted.headers, admitted.body)
        request.floodwall = admitted
        with admitted:
            if self.guard.idempotency_key(inbound) is not None:
                return self._idempotent(request, inbound, admitted)
            try:
                response = self.get_response(request)
            except BaseException as exc:
                admitted.close(error=exc)
                raise
            return self._finish(admitted, response)

    async def _acall(self, request: HttpRequest) -> Response:
        inbound = _inbound(request, self._wanted)
        admitted = self.guard.admit(inbound)
        if isinstance(admitted, Refusal):
            return _answer(admitted.status, admitted.headers, admitted.body)
        request.floodwall = admitted
        with admitted:
            if self.guard.idempotency_key(inbound) is not None:
                return await self._aidempotent(request, inbound, admitted)
            try:
                response = await self.get_response(request)
            except BaseException as exc:
                admitted.close(error=exc)
                raise
            return self._finish(admitted, response)

    def process_exception(self, request: HttpRequest, exception: Exception) -> Response | None:
        """A floodwall rejection raised by a view (an open breaker, a full bulkhead, a
        timeout) is answered as the guard answers its own refusals, not as a bare 500."""
        admitted = getattr(request, "floodwall", None)
        if not isinstance(admitted, Admission):
            return None
        answer = self.guard.answer_error(exception, admitted)
        return None if answer is None else _answer(answer.status, answer.headers, answer.body)

    @staticmethod
    def _finish(admitted: Admission, response: Response) -> Response:
        status = response.status_code
        for name, value in admitted.response_headers(status):
            response[name] = value
        if not admitted.status:  # answer_error already ended the ticket for its answer
            admitted.status = status
            admitted.close(status)
        return response

    def _idempotent(self, request: HttpRequest, inbound: Inbound, admitted: Admission) -> Response:
        ran: list[Response] = []

        def produce() -> Captured:
            response = self.get_response(request)
            ran.append(response)
            return _captured(response)

        try:
            outcome = self.guard.idempotent(inbound, request.body, produce)
        except BaseException as exc:
            admitted.close(error=exc)
            raise
        return self._settled(admitted, outcome, ran)

    async def _aidempotent(
        self, request: HttpRequest, inbound: Inbound, admitted: Admission
    ) -> Response:
        ran: list[Response] = []
        get_response: Callable[[HttpRequest], Awaitable[Response]] = self.get_response

        async def produce() -> Captured:
            response = await get_response(request)
            ran.append(response)
            return _captured(response)

        try:
            outcome = await self.guard.idempotent_async(inbound, request.body, produce)
        except BaseException as exc:
            admitted.close(error=exc)
            raise
        return self._settled(admitted, outcome, ran)

    def _settled(
        self,
        admitted: Admission,
        outcome: tuple[Captured, bool] | Refusal,
        ran: list[Response],
    ) -> Response:
        if isinstance(outcome, Refusal):
            admitted.status = outcome.status
            admitted.close(outcome.status)
            return _answer(outcome.status, outcome.headers, outcome.body)
        captured, replayed = outcome
        if ran and not replayed:
            return self._finish(admitted, ran[0])  # the view's own response, cookies and all
        response = _answer(captured.status, captured.headers, captured.body)
        response[IDEMPOTENT_REPLAYED] = "true"
        return self._finish(admitted, response)
