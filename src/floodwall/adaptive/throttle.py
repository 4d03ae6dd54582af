"""Client-side throttling: stop sending what the backend will only reject.

Google's SRE book, chapter 21 "Handling Overload", section "Client-side throttling"
(equation 21-1). Each client keeps, over the last ``window`` seconds (two minutes):

* ``requests``: calls attempted by the application, counted *before* going out, including the
  ones this throttle rejects locally;
* ``accepts``: calls the backend accepted (answered with anything but an overload rejection).

A new call is rejected locally with probability

    p_reject = max(0, (requests − K × accepts) / (requests + 1))

With ``K = 2`` the client keeps sending up to twice what gets accepted, so the backend still
sees enough traffic to signal recovery, while the bulk of the doomed requests never leaves the
client. Lower K is more aggressive, higher K more lenient. Vectors: no history → 0; requests ==
accepts → 0; 100 requests with 50 accepts → 0 (exactly at K); 100 requests, 0 accepts →
100/101; 300 requests, 100 accepts → 100/301.

:class:`ClientThrottle` is a policy: ``call``/``call_async`` raise
:class:`~floodwall.OverloadedError` on a local rejection. Failures that count as backend
rejections (not accepts) are floodwall rejections and timeouts by default, plus any result for
which ``rejected_result(result)`` is true (an HTTP 429/503 response).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import OverloadedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.outcome import Kind, Outcomes
from floodwall._core.window import TimeWindow

__all__ = ["ClientThrottle", "ThrottleOptions", "reject_probability"]


def reject_probability(requests: float, accepts: float, k: float = defaults.THROTTLE_K) -> float:
    """``max(0, (requests − k × accepts) / (requests + 1))`` (SRE book, eq. 21-1)."""
    return max(0.0, (requests - k * accepts) / (requests + 1))


_BACKEND_REJECTIONS = Outcomes(kinds=frozenset({"rejected", "timeout"}))
"""The default ``backend_rejections``: a rejection or a timeout is the backend saying no."""


@dataclass(frozen=True, slots=True)
class ThrottleOptions:
    """A :class:`ClientThrottle`'s options (the SRE book's ``K = 2`` over two minutes in 24
    buckets), validated once. ``backend_rejections`` is kept as an
    :class:`~floodwall.Outcomes`; ``rejected_result`` is a predicate on a returned value."""

    k: float = defaults.THROTTLE_K
    window: float = defaults.THROTTLE_WINDOW
    buckets: int = defaults.THROTTLE_BUCKETS
    min_requests: int = 0
    max_reject: float = 1.0
    backend_rejections: Outcomes = _BACKEND_REJECTIONS
    rejected_result: Callable[[Any], bool] | None = None

    CHECKS: ClassVar[Checks] = {
        "k": partial(validate.number, low=0.0, low_open=True),
        "window": partial(validate.seconds, positive=True),
        "buckets": partial(validate.count, maximum=defaults.MAX_SLOTS),
        "min_requests": partial(validate.count, minimum=0),
        "max_reject": partial(validate.number, low=0.0, high=1.0, low_open=True),
        "backend_rejections": Outcomes.of,
        "rejected_result": optional(partial(validate.function, what="a predicate")),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


class ClientThrottle(Gate):
    """Adaptive client-side throttling after the SRE book (see
    [Overload protection][guide-overload]).

    The pure core is :meth:`attempt` (``now`` and a uniform draw in [0, 1) in, a verdict out) and
    :meth:`accept`; :meth:`allow` draws from ``rng`` on ``clock``. ``min_requests`` (default 0)
    leaves the throttle off until the window holds that many requests, as aegis' SRE breaker
    does with 100. ``max_reject`` (default 1.0) caps p_reject so that a client whose backend
    was down for the whole window still sends a trickle of probes.

    As a gate: ``admit`` counts the attempt and refuses with :class:`~floodwall.OverloadedError`
    when the draw says so (:meth:`allow`); ``record`` counts the call as accepted by the backend
    unless it ended with one of ``backend_rejections`` (exception types or an
    :class:`~floodwall.Outcomes`; default the kinds ``rejected`` and ``timeout``) (or a
    ``rejected_result``), or was
    interrupted (cancelled) before an answer.
    """

    kind = "client_throttle"

    def __init__(
        self,
        name: str = "client_throttle",
        *,
        k: float = defaults.THROTTLE_K,
        window: float = defaults.THROTTLE_WINDOW,
        buckets: int = defaults.THROTTLE_BUCKETS,
        min_requests: int = 0,
        max_reject: float = 1.0,
        backend_rejections: type[BaseException]
        | tuple[type[BaseException], ...]
        | Outcomes = _BACKEND_REJECTIONS,
        rejected_result: Callable[[Any], bool] | None = None,
        rng: random.Random | None = None,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = validate.text("name", name)
        self.options = o = ThrottleOptions(
            k,
            window,
            buckets,
            min_requests,
            max_reject,
            backend_rejections,  # type: ignore[arg-type]  # normalised to Outcomes by its check
            rejected_result,
        )
        """The validated :class:`ThrottleOptions`, copied once into the fields below."""
        self.k = o.k
        self.window = o.window
        self.buckets = o.buckets
        self.min_requests = o.min_requests
        self.max_reject = o.max_reject
        self.backend_rejections = o.backend_rejections
        """The errors that count as the backend refusing (an outcome selection)."""
        self.rejected_result = o.rejected_result
        self.rng = rng or random.Random()
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._lock = threading.Lock()
        span = self.window / self.buckets
        self._requests = TimeWindow(self.buckets, span, latency=False)
        self._accepts = TimeWindow(self.buckets, span, latency=False)

    # -- the pure core ------------------------------------------------------------------------

    def counts(self, now: float) -> tuple[int, int]:
        """``(requests, accepts)`` over the window ending at ``now``."""
        with self._lock:
            self._requests.refresh(now)
            self._accepts.refresh(now)
            return self._requests.calls, self._accepts.calls

    def probability(self, now: float | None = None) -> float:
        """The current p_reject (capped by ``max_reject``)."""
        requests, accepts = self.counts(self._now() if now is None else now)
        if requests < self.min_requests:
            return 0.0
        return min(self.max_reject, reject_probability(requests, accepts, self.k))

    def attempt(self, now: float, draw: float) -> bool:
        """Count one attempt at ``now``; with ``draw`` uniform in [0, 1), is it sent?"""
        with self._lock:
            self._requests.refresh(now)
            self._accepts.refresh(now)
            requests, accepts = self._requests.calls, self._accepts.calls
            self._requests.record(now, Kind.SUCCESS, 0.0)
        if requests < self.min_requests:
            return True
        p = min(self.max_reject, reject_probability(requests, accepts, self.k))
        if draw < p:
            if self.listeners:
                self.listeners.emit(
                    Event(
                        "rejected",
                        self.kind,
                        self.name,
                        now,
                        f"p_reject {p:.3f} ({requests} requests, {accepts} accepts)",
                        figures={"p_reject": p, "requests": requests, "accepts": accepts},
                    )
                )
            return False
        return True

    def accept(self, now: float | None = None) -> None:
        """The backend accepted a call (record when its answer arrives)."""
        at = self._now() if now is None else now
        with self._lock:
            self._accepts.record(at, Kind.SUCCESS, 0.0)

    # -- the shell ----------------------------------------------------------------------------

    def allow(self) -> bool:
        """Count an attempt now and decide with a draw from ``rng``."""
        return self.attempt(self._now(), self.rng.random())

    def _rejection(self) -> OverloadedError:
        p = self.probability()
        return OverloadedError(self.name, f"client-side throttling (p_reject {p:.2f})", None)

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Count the attempt; refuse it when the draw falls under p_reject."""
        if not self.attempt(now, self.rng.random()):
            raise self._rejection()

    def record(
        self,
        permit: None,
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        """An answer, if an error, is an accept; a backend rejection or no answer is not."""
        if error is None:
            if self.rejected_result is None or not self.rejected_result(result):
                self.accept(now)
        elif isinstance(error, Exception) and not self.backend_rejections.error(error):
            self.accept(now)

    def describe(self) -> str:
        return f"ClientThrottle(k={self.k:g}, window={self.window:g}s)"
