"""gRPC integration: client and server interceptors, sync and ``grpc.aio`` (needs grpcio).

See :mod:`floodwall.integrations.grpc` and ``docs/integrations.md``.
"""

from floodwall.integrations.grpc import (
    AsyncGuardInterceptor,
    AsyncResilientInterceptor,
    GuardInterceptor,
    ResilientInterceptor,
)

__all__ = [
    "AsyncGuardInterceptor",
    "AsyncResilientInterceptor",
    "GuardInterceptor",
    "ResilientInterceptor",
]
