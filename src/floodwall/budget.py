"""Retry budgets: retries may add at most ``ratio`` to the traffic, whatever fails.

A maximum number of attempts bounds the amplification of one request; it does nothing about
ten thousand requests failing at once, each retrying twice. A budget bounds the sum: over a
rolling window (10 s in 10 buckets by default) it counts requests and retries, and grants a
retry only while

    retries + 1 <= ratio × requests + min_per_second × window

so retries stay within ``ratio`` of the requests (the seeds' 10 %, an amplification of about
1.1 ×) plus a small floor that lets a quiet caller still retry a blip. It is the retry budget of
Finagle (``RetryBudget``, "percentCanRetry" and "minRetriesPerSec" over a TTL), Linkerd and
Envoy; the seeds describe the same rule as ``sum(RC) / sum(SC) < 0.1`` over the last 10 buckets.

One budget can be shared by many :class:`~floodwall.Retry` and :class:`~floodwall.Hedge`
policies (one per dependency, or one per process). Nested policies that share a budget count
one logical request once, not once per layer.

The counts live in a :class:`~floodwall.TimeWindow`: a request is a lock-free success record
(one atomic counter bump), a granted retry a failure record taken under the budget's lock, so
``requests = calls − failures`` and ``retries = failures``. Thread-safe.
"""

from __future__ import annotations

import threading
from contextvars import Token
from dataclasses import dataclass
from functools import partial
from typing import Any

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import RejectedError
from floodwall._core.options import Checks
from floodwall._core.outcome import Kind
from floodwall._core.window import TimeWindow
from floodwall.context import _BUDGETS

__all__ = ["BudgetSnapshot", "RetryBudget", "RetryBudgetExhausted"]

_SLACK = 1e-9
"""Absorbs float rounding in ``ratio × requests`` (0.29 × 100 is 28.999999999999996)."""


_INF = float("inf")


class RetryBudgetExhausted(RejectedError):  # noqa: N818 - the name is the public contract
    """A retry budget refused a retry: ``RetryBudgetExhausted(name, reason)``.

    Not raised in place of the failure: the caller still gets the original error, with this
    error's text added as a note (PEP 678) and the instance kept on
    :func:`floodwall.retry.gave_up`'s record, so handlers see what failed *and* why it was not
    retried.
    """

    kind = "retry_budget_exhausted"

    def __str__(self) -> str:
        return f"{self.name!r}: {self.reason}"


@dataclass(frozen=True, slots=True)
class BudgetSnapshot:
    """A budget's figures at one moment: what the window holds and what it allows."""

    requests: int
    retries: int
    ratio: float
    floor: float
    """``min_per_second × window``: retries allowed whatever the traffic."""
    span: float

    @property
    def allowance(self) -> float:
        """Retries the window allows in total: ``ratio × requests + floor``."""
        return self.ratio * self.requests + self.floor

    @property
    def available(self) -> int:
        """Retries that would be granted now, one after the other."""
        return max(0, int(self.allowance + _SLACK) - self.retries)

    @property
    def retry_ratio(self) -> float:
        """Retries per request in the window (0.0 without requests)."""
        return self.retries / self.requests if self.requests else 0.0


CHECKS: Checks = {
    "ratio": partial(validate.number, low=0.0, high=1.0, unit="retries per request"),
    "min_per_second": partial(validate.number, low=0.0, unit="retries per second"),
    "window": partial(validate.seconds, positive=True),
    "buckets": validate.count,
}
"""The checks of :class:`RetryBudget`'s options (the configuration's ``budget:`` runs them too)."""


class RetryBudget:
    """Grant retries only while they stay within ``ratio`` of the requests (see the module).

    ``ratio`` is retries per request, in ``[0, 1]``; ``min_per_second`` (``>= 0``) the retries
    per second allowed whatever the traffic; the window is ``window`` seconds in ``buckets``
    buckets. Policies call :meth:`deposit` once per logical request and :meth:`try_withdraw`
    before each retry; ``clock`` is only read by :meth:`snapshot` without an explicit ``now``.
    """

    __slots__ = (
        "_add",
        "_floor",
        "_lock",
        "_users",
        "_window",
        "buckets",
        "clock",
        "min_per_second",
        "name",
        "ratio",
        "window",
    )

    def __init__(
        self,
        ratio: float = defaults.RETRY_BUDGET_RATIO,
        *,
        min_per_second: float = defaults.RETRY_BUDGET_MIN_PER_SECOND,
        window: float = defaults.RETRY_BUDGET_WINDOW,
        buckets: int = defaults.RETRY_BUDGET_BUCKETS,
        name: str = "retry_budget",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.ratio = CHECKS["ratio"]("ratio", ratio)
        self.min_per_second = CHECKS["min_per_second"]("min_per_second", min_per_second)
        self.window = CHECKS["window"]("window", window)
        self.buckets = CHECKS["buckets"]("buckets", buckets)
        self.name = validate.text("name", name)
        self.clock = clock
        self._floor = self.min_per_second * self.window
        self._window = TimeWindow(buckets, self.window / buckets, latency=False)
        self._add = self._window.add_success_in
        """The lock-free half of :meth:`deposit`, bound once (policies inline it): called with
        bin 0, as the window keeps no latency histogram (no bisection of a 0.0 duration and no
        ``add_success`` frame per request)."""
        self._lock = threading.Lock()
        self._users = 0

    # -- the pure core ----------------------------------------------------------------------

    def deposit(self, now: float) -> None:
        """Count one request at ``now``. Lock-free in the common case (O(1))."""
        if not self._add(now, 0.0, 0):
            with self._lock:
                self._window.record(now, Kind.SUCCESS, 0.0)

    def try_withdraw(self, now: float) -> bool:
        """Count one retry at ``now`` if the budget allows it; return whether it did.

        O(buckets), under the budget's lock.
        """
        window = self._window
        with self._lock:
            window.refresh(now)
            calls, retries = window.totals()[:2]
            if retries + 1 > self.ratio * (calls - retries) + self._floor + _SLACK:
                return False
            window.record(now, Kind.FAILURE, 0.0)
            return True

    def snapshot(self, now: float | None = None) -> BudgetSnapshot:
        """The window's figures at ``now`` (default: the budget's clock)."""
        at = self.clock.monotonic() if now is None else now
        with self._lock:
            self._window.refresh(at)
            calls, retries = self._window.totals()[:2]
        return BudgetSnapshot(
            requests=calls - retries,
            retries=retries,
            ratio=self.ratio,
            floor=self._floor,
            span=self.window,
        )

    def exhausted(self, origin: str, now: float) -> RetryBudgetExhausted:
        """The error that explains a refusal at ``now`` to a policy named ``origin``."""
        snap = self.snapshot(now)
        return RetryBudgetExhausted(
            self.name,
            f"retry budget exhausted for {origin!r}: {snap.retries} retries for "
            f"{snap.requests} requests in the last {self.window:g}s; allowed "
            f"{self.ratio:g} × {snap.requests} + {self.min_per_second:g}/s × {self.window:g}s "
            f"= {snap.allowance:g}",
            None,
        )

    def reset(self) -> None:
        """Forget every request and retry."""
        with self._lock:
            self._window.reset()

    # -- sharing ----------------------------------------------------------------------------

    def enter(self, now: float) -> Token[tuple[Any, ...]] | None:
        """Count a logical request at ``now`` unless an enclosing policy already counted it in
        this budget; returns a token for :meth:`leave` when it marked the context.

        Only a shared budget marks the context (one context variable set): a private budget
        cannot be counted twice, so it just deposits.
        """
        if not self._users > 1:
            self.deposit(now)
            return None
        charged = _BUDGETS.get()
        if self in charged:
            return None
        if not self._add(now, 0.0, 0):
            self.deposit(now)
        return _BUDGETS.set((*charged, self))

    @staticmethod
    def leave(token: Token[tuple[Any, ...]] | None) -> None:
        """Undo :meth:`enter` when the logical request ends."""
        if token is not None:
            _BUDGETS.reset(token)

    def attach(self) -> None:
        """Called by each policy that uses this budget (a shared budget dedupes nested calls)."""
        with self._lock:
            self._users += 1

    @property
    def shared(self) -> bool:
        """Whether more than one policy uses this budget."""
        return self._users > 1

    def __repr__(self) -> str:
        return (
            f"RetryBudget({self.name!r}, ratio={self.ratio:g}, "
            f"min_per_second={self.min_per_second:g}, window={self.window:g}s/{self.buckets})"
        )
