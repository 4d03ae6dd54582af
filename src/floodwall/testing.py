"""floodwall's pytest plugin: a fake clock, backoff waits switched off, fault injection.

Registered through the ``pytest11`` entry point (installing floodwall is enough), or by hand
with ``-p floodwall.testing``. Nothing here imports an HTTP client until it is asked for.

Fixtures:

* ``fake_clock``: a fresh :class:`~floodwall.FakeClock` at t = 1000 s; pass it as ``clock=`` to
  policies and move time with ``fake_clock.advance(seconds)``.
* ``no_backoff``: every :class:`~floodwall.Retry` retries at once instead of waiting its backoff
  (or a ``Retry-After``); the waits it skipped are listed in ``no_backoff.delays``. The
  decisions are unchanged: only the sleeping is skipped. ``--floodwall-no-backoff`` on the
  command line applies it to every test.

Fault injection (imported on first use): :class:`Fault`, :class:`Faults`; ``FaultTransport`` /
``AsyncFaultTransport`` for httpx (needs httpx) and ``FaultMiddleware`` for aiohttp (needs
aiohttp)::

    from floodwall.testing import Fault, FaultTransport
    from floodwall.httpx import ResilientTransport

    faults = FaultTransport([Fault.answer(503, retry_after=1), Fault.connect(), None])
    client = httpx.Client(transport=ResilientTransport(faults, policy=retry))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from floodwall._core.clock import FakeClock
from floodwall.integrations._faults import Fault, Faults
from floodwall.retry import Retry, RetryState

__all__ = [
    "AsyncFaultTransport",
    "BackoffWaits",
    "Fault",
    "FaultMiddleware",
    "FaultTransport",
    "Faults",
    "fake_clock",
    "no_backoff",
    "skip_backoff",
]

if TYPE_CHECKING:
    from floodwall.aiohttp import FaultMiddleware
    from floodwall.httpx import AsyncFaultTransport, FaultTransport

_LAZY = {
    "FaultTransport": "floodwall.httpx",
    "AsyncFaultTransport": "floodwall.httpx",
    "FaultMiddleware": "floodwall.aiohttp",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


class BackoffWaits:
    """The backoff waits skipped while :func:`skip_backoff` is in force, in seconds."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __len__(self) -> int:
        return len(self.delays)


def skip_backoff(monkeypatch: pytest.MonkeyPatch) -> BackoffWaits:
    """Make every :class:`~floodwall.Retry` retry without waiting, until ``monkeypatch`` undoes
    it; returns the record of the skipped waits."""
    waits = BackoffWaits()
    decide = Retry.decide

    def no_wait(
        self: Retry, state: RetryState, error: BaseException | None, result: Any, now: float
    ) -> float:
        delay = decide(self, state, error, result, now)
        if delay > 0:
            waits.delays.append(delay)
            return 0.0
        return delay

    monkeypatch.setattr(Retry, "decide", no_wait)
    return waits


@pytest.fixture
def fake_clock() -> FakeClock:
    """A fresh :class:`~floodwall.FakeClock` starting at t = 1000 s."""
    return FakeClock(1000.0)


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> BackoffWaits:
    """Retries in this test do not wait (see :func:`skip_backoff`)."""
    return skip_backoff(monkeypatch)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("floodwall")
    group.addoption(
        "--floodwall-no-backoff",
        action="store_true",
        default=False,
        help="floodwall: retries do not wait their backoff in any test",
    )


@pytest.fixture(autouse=True)
def _floodwall_backoff_switch(request: pytest.FixtureRequest) -> Iterator[None]:
    if not request.config.getoption("--floodwall-no-backoff", default=False):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        skip_backoff(patch)
        yield
