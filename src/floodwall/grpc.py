"""gRPC interceptors: clients through their dependency's policies, servers behind the guard.

Client (sync channel and ``grpc.aio``)::

    channel = grpc.intercept_channel(grpc.insecure_channel(target), ResilientInterceptor(policy))
    channel = grpc.aio.insecure_channel(target, interceptors=[AsyncResilientInterceptor(policy)])

Server::

    server = grpc.aio.server(interceptors=[AsyncGuardInterceptor(limits=[...], shedder=...)])
    server = grpc.server(pool, interceptors=[GuardInterceptor(limits=[...])])

**Client.** Unary-unary calls run through the policy chosen by target and method (routes match
``host:port`` and the method path ``/package.Service/Method``). The deadline is gRPC's own: the
call's timeout becomes the ambient time left minus the margin (sent as ``grpc-timeout``). Status
codes are classified: ``UNAVAILABLE`` and ``ABORTED`` are transient, ``DEADLINE_EXCEEDED`` a
timeout, ``RESOURCE_EXHAUSTED`` an overload signal (retried only after a
``grpc-retry-pushback-ms``, and never after a negative one), ``INTERNAL``/``UNKNOWN``/
``DATA_LOSS`` server errors; the rest are business answers, neither counted nor retried. gRPC
methods are all POSTs to HTTP, so only methods listed in ``idempotent`` (full paths) and calls
carrying ``idempotency-key`` metadata are retried. Retries carry ``x-retry-attempt`` metadata, and
``x-request-priority`` / ``x-admission-level`` do what their HTTP headers do. Streaming calls
pass through untouched (a stream cannot be replayed).

**Server.** Unary-unary handlers are guarded (other kinds pass through) by the inbound core
(:mod:`floodwall.integrations._inbound`): the deadline is the call's own (``time_remaining``), a
refusal aborts with ``RESOURCE_EXHAUSTED`` (429), ``UNAVAILABLE`` (503),
``DEADLINE_EXCEEDED`` (504), ``ABORTED`` (409), ``FAILED_PRECONDITION`` (422) or
``INVALID_ARGUMENT`` (400), with ``grpc-retry-pushback-ms`` for its Retry-After and the
``ratelimit-*`` metadata. Idempotency is not applied to gRPC (the guard would need the raw
request and answer bytes); use :class:`~floodwall.Idempotency` in the handler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from functools import partial
from typing import Any, NamedTuple, Unpack, cast

from floodwall._core.extras import missing_extra

try:
    import grpc
    import grpc.aio
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.grpc", "grpc") from _missing

from floodwall._core.drivers import drive_async, drive_sync
from floodwall._core.policy import Policy
from floodwall._core.steps import CALL, Either, Step
from floodwall.integrations._inbound import (
    Admission,
    GuardOptions,
    Inbound,
    InboundGuard,
    Refusal,
)
from floodwall.integrations._outbound import Call, Outbound, OutboundOptions, _AttemptError
from floodwall.integrations._wire import (
    ADMISSION_LEVEL,
    GRPC_PUSHBACK,
    RETRY_PUSHBACK,
    format_deadline,
)

__all__ = [
    "AsyncGuardInterceptor",
    "AsyncResilientInterceptor",
    "GuardInterceptor",
    "ResilientInterceptor",
]

Metadata = Sequence[tuple[str, str | bytes]]
_TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED})
_SERVER_ERROR = frozenset(
    {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
)
_CODE_OF_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    409: grpc.StatusCode.ABORTED,
    422: grpc.StatusCode.FAILED_PRECONDITION,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
_STATUS_OF_CODE = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.DATA_LOSS: 500,
}


# -- client ---------------------------------------------------------------------------------------


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Metadata | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


_AnyDetails = grpc.ClientCallDetails | grpc.aio.ClientCallDetails
_Fields = tuple[str, float | None, list[tuple[str, str | bytes]], Any, bool | None]


class _ClientBase:
    def __init__(
        self,
        policy: Policy | None = None,
        *,
        target: str = "",
        idempotent: Iterable[str] = (),
        **options: Unpack[OutboundOptions],
    ) -> None:
        self.core = Outbound(policy, **options)
        self.target = target
        host, _, port = target.rpartition(":")
        self._host = host or target
        self._port = int(port) if port.isdigit() else None
        self.idempotent = frozenset(idempotent)

    def _begin(self, details: _AnyDetails) -> Call:
        method = _text(details.method)
        verb = "GET" if method in self.idempotent else "POST"
        key = _value(cast(Metadata | None, details.metadata), "idempotency-key")
        return self.core.begin(verb, self._host, self._port, method, key)

    def _details(self, call: Call, details: _AnyDetails) -> _Fields:
        """``(method, timeout, metadata, credentials, wait_for_ready)`` for one attempt."""
        metadata: list[tuple[str, str | bytes]] = [
            (name, value) for name, value in (details.metadata or ()) if name not in _OURS
        ]
        metadata += [(name.lower(), value) for name, value in call.headers() if name != _DEADLINE]
        timeout = details.timeout
        left = call.attempt_timeout()
        if left is not None:
            left = max(left - self.core.margin, 0.001)
            timeout = left if timeout is None else min(timeout, left)
        return (details.method, timeout, metadata, details.credentials, details.wait_for_ready)


_DEADLINE = "X-Request-Deadline"
_OURS = frozenset({"x-retry-attempt", "x-request-priority"})


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _value(metadata: Metadata | None, name: str) -> str | None:
    for key, value in metadata or ():
        if key == name:
            return _text(value)
    return None


def _getter(metadata: Metadata | None) -> Callable[[str], str | None]:
    def get(name: str) -> str | None:
        if name == RETRY_PUSHBACK.lower():
            name = GRPC_PUSHBACK
        return _value(metadata, name)

    return get


def _judge(
    call: Call, code: grpc.StatusCode, trailing: Metadata | None, error: BaseException
) -> _AttemptError | None:
    """The failure to raise inside the pipeline for a call that ended with ``code``."""
    if code in _TRANSIENT:
        call.check(200, _getter(trailing), None)  # read the admission level
        return call.io_error(error)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return call.timeout_error(error)
    status = _STATUS_OF_CODE.get(code)
    if status is None:
        call.check(200, _getter(trailing), None)
        return None
    failure = call.check(status, _getter(trailing), None)
    if failure is not None:
        failure.original = error
    return failure


class ResilientInterceptor(_ClientBase, grpc.UnaryUnaryClientInterceptor):
    """Sync client interceptor: ``grpc.intercept_channel(channel, ResilientInterceptor(...))``.

    ``ResilientInterceptor(policy=None, *, target="", idempotent=(), registry=None,
    routes=None, margin=0.010, …)``; ``target`` (``host:port``) is what routes match and what
    early shedding remembers levels by.
    """

    def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> Any:
        call = self._begin(client_call_details)

        def attempt() -> Any:
            fields = self._details(call, client_call_details)
            details = cast(grpc.ClientCallDetails, _Details(*fields, None))
            outcome = continuation(details, request)
            code = outcome.code()
            if code == grpc.StatusCode.OK:
                call.check(200, _getter(outcome.trailing_metadata()), None)
                return outcome
            failure = _judge(call, code, outcome.trailing_metadata(), outcome)
            if failure is None:
                return outcome
            failure.answer = outcome  # hand the failed call back: .result() raises as usual
            raise failure

        return call.run(attempt)


class _Business(NamedTuple):
    error: BaseException


class AsyncResilientInterceptor(_ClientBase, grpc.aio.UnaryUnaryClientInterceptor):
    """``grpc.aio`` client interceptor: ``grpc.aio.insecure_channel(target,
    interceptors=[AsyncResilientInterceptor(..., target=target)])``."""

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        call = self._begin(client_call_details)

        async def attempt() -> Any:
            fields = cast(Any, self._details(call, client_call_details))
            details = grpc.aio.ClientCallDetails(*fields)
            rpc = await continuation(details, request)
            try:
                response = await rpc
            except grpc.aio.AioRpcError as error:
                trailing = cast(Metadata, error.trailing_metadata())
                failure = _judge(call, error.code(), trailing, error)
                if failure is None:
                    return _Business(error)
                raise failure from None
            call.check(200, _getter(await rpc.trailing_metadata()), None)
            return response

        result = await call.run_async(attempt)
        if isinstance(result, _Business):
            raise result.error
        return result


# -- server ---------------------------------------------------------------------------------------


def _peer(peer: str) -> str | None:
    """``ipv4:127.0.0.1:5000`` / ``ipv6:[::1]:5000`` → the address."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or None
    return None


def _inbound(method: str, metadata: Metadata | None, context: Any) -> Inbound:
    headers = {name: value for name, value in metadata or () if isinstance(value, str)}
    left = context.time_remaining()
    if left is not None and left < 1e8:
        headers["x-request-deadline"] = format_deadline(left)
    else:
        headers.pop("x-request-deadline", None)
    return Inbound("POST", method, headers, _peer(context.peer()))


def _refusal_metadata(refused: Refusal) -> list[tuple[str, str]]:
    out = []
    for name, value in refused.headers:
        lower = name.lower()
        if lower == "retry-after":
            out.append((GRPC_PUSHBACK, str(int(value) * 1000)))
        elif lower.startswith("ratelimit") or lower == ADMISSION_LEVEL.lower():
            out.append((lower, value))
    return out


def _trailing(admitted: Admission, status: int) -> list[tuple[str, str]]:
    out = []
    for name, value in admitted.response_headers(status):
        lower = name.lower()
        out.append((GRPC_PUSHBACK if lower == RETRY_PUSHBACK.lower() else lower, value))
    return out


def _status(context: Any, error: BaseException | None) -> int:
    code = context.code() if hasattr(context, "code") else None
    if code is None:
        return 500 if error is not None else 200
    return _STATUS_OF_CODE.get(code, 400)


def _guarded(
    guard: InboundGuard, method: str, metadata: Metadata | None, context: Any
) -> Generator[Step, Any, Any]:
    """One guarded unary call, for both servers: admit (or abort with the refusal's code and
    trailers), run the handler (the driver's call), close the admission with its status."""
    admitted = guard.admit(_inbound(method, metadata, context))
    if isinstance(admitted, Refusal):
        context.set_trailing_metadata(tuple(_refusal_metadata(admitted)))
        code = _CODE_OF_STATUS.get(admitted.status, grpc.StatusCode.UNAVAILABLE)
        abort = partial(context.abort, code, str(admitted.error))
        yield Either(abort, abort)  # raises; grpc.aio's abort is a coroutine function
    assert isinstance(admitted, Admission)
    with admitted:
        try:
            response = yield CALL
        except BaseException as exc:
            status = _status(context, exc)
            context.set_trailing_metadata(tuple(_trailing(admitted, status)))
            admitted.close(error=exc)
            raise
    context.set_trailing_metadata(tuple(_trailing(admitted, 200)))
    admitted.close(200)
    return response


def _guard_handler(
    guard: InboundGuard,
    handler: grpc.RpcMethodHandler[Any, Any] | None,
    details: grpc.HandlerCallDetails,
    aio: bool,
) -> grpc.RpcMethodHandler[Any, Any] | None:
    """``handler`` with its unary-unary behaviour behind ``guard`` (other kinds pass)."""
    if handler is None or handler.unary_unary is None:
        return handler
    behavior = handler.unary_unary
    method = details.method
    metadata = details.invocation_metadata

    def guarded(request: Any, context: grpc.ServicerContext) -> Any:
        steps = _guarded(guard, method, metadata, context)
        return drive_sync(steps, partial(behavior, request, context))

    async def guarded_async(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        steps = _guarded(guard, method, metadata, context)
        return await drive_async(steps, partial(cast(Any, behavior), request, context))

    return grpc.unary_unary_rpc_method_handler(
        cast(Any, guarded_async if aio else guarded),
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class GuardInterceptor(grpc.ServerInterceptor):
    """Sync server interceptor: ``grpc.server(pool, interceptors=[GuardInterceptor(...)])``;
    options as :class:`~floodwall.integrations._inbound.InboundGuard`'s, or a shared ``guard``."""

    def __init__(self, guard: InboundGuard | None = None, **options: Unpack[GuardOptions]) -> None:
        self.guard = guard if guard is not None else InboundGuard(**options)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        return _guard_handler(self.guard, handler, handler_call_details, aio=False)


class AsyncGuardInterceptor(grpc.aio.ServerInterceptor):
    """``grpc.aio`` server interceptor: ``grpc.aio.server(interceptors=[...])``."""

    def __init__(self, guard: InboundGuard | None = None, **options: Unpack[GuardOptions]) -> None:
        self.guard = guard if guard is not None else InboundGuard(**options)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        return _guard_handler(self.guard, handler, handler_call_details, aio=True)
