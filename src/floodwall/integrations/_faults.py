"""Fault injection for client tests: what goes wrong, and to which request.

A :class:`Fault` says what goes wrong with one request: an answer with a ``status`` (and
``Retry-After``), a connection that cannot be opened (``connect``), an answer that never comes
(``timeout``), a connection dropped after the request went out (``disconnect``), or extra
``latency`` before the real request is sent. A :class:`Faults` plan hands them out, one per
request: first the listed ``plan`` in order (``None`` = no fault), then, forever, ``then`` with
probability ``rate`` (drawn from ``rng``, seedable). ``injected`` counts what was injected.

The injectors live beside each client's integration: ``floodwall.httpx.
FaultTransport`` / ``AsyncFaultTransport`` (status faults answered by the transport itself, the
upstream is not called) and ``floodwall.aiohttp.FaultMiddleware`` (the request is
sent and the answer's status, headers and body replaced: aiohttp has no public way to build a
response). :mod:`floodwall.testing` re-exports them lazily. Latency waits on the injector's
``clock`` (a :class:`~floodwall.FakeClock` makes it free).
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Fault", "Faults", "as_faults"]

FaultKind = Literal["status", "connect", "timeout", "disconnect", "latency"]


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected failure (see [Integrations][guide-integrations]); build with the class
    methods."""

    kind: FaultKind
    status: int = 503
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    delay: float = 0.0

    @classmethod
    def answer(
        cls, status: int = 503, *, retry_after: float | None = None, body: bytes | None = None
    ) -> Fault:
        headers: tuple[tuple[str, str], ...] = ()
        if retry_after is not None:
            headers = (("Retry-After", f"{retry_after:g}"),)
        if body is None:
            body = json.dumps({"status": status, "detail": "injected fault"}).encode()
        return cls("status", status, headers, body)

    @classmethod
    def connect(cls) -> Fault:
        return cls("connect")

    @classmethod
    def timeout(cls) -> Fault:
        return cls("timeout")

    @classmethod
    def disconnect(cls) -> Fault:
        return cls("disconnect")

    @classmethod
    def latency(cls, seconds: float) -> Fault:
        return cls("latency", delay=seconds)


@dataclass
class Faults:
    """Which request gets which fault (see [Integrations][guide-integrations]). Thread-safe."""

    plan: Iterable[Fault | None] = ()
    then: Fault | None = None
    rate: float = 1.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    injected: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rate <= 1:
            raise ValueError(f"rate must be in [0, 1], got {self.rate!r}")
        self._plan = iter(list(self.plan))
        self._lock = threading.Lock()

    def next(self) -> Fault | None:
        """The fault for the next request, or ``None``."""
        with self._lock:
            fault = next(self._plan, _DONE)
            if fault is _DONE:
                fault = (
                    self.then if self.then is not None and self.rng.random() < self.rate else None
                )
            if fault is not None:
                self.injected += 1
            return fault


_DONE: Any = object()


def as_faults(faults: Faults | Iterable[Fault | None]) -> Faults:
    """A :class:`Faults` plan from one, or from a list of faults (``None`` = no fault)."""
    return faults if isinstance(faults, Faults) else Faults(plan=faults)
