"""AIMD: additive increase, multiplicative decrease, driven by drops.

The loss-based limit of concurrency-limits (``AIMDLimit``): a sample that was dropped, or took
longer than ``timeout``, multiplies the limit by ``backoff_ratio`` (rounded down); any other sample
taken while at least half the limit was in use adds one. The limit stays in
``[min_limit, max_limit]``.

Defaults are the Java builder's: ``initial_limit=20``, ``min_limit=20``, ``max_limit=200``,
``backoff_ratio=0.9``, ``timeout=5`` s. Golden trace (``AIMDLimitTest``): from 20, a success at
inflight 10 gives 21; from 30, a drop gives 27.
"""

from __future__ import annotations

from floodwall._core import defaults
from floodwall._core.errors import ConfigError
from floodwall.adaptive._base import Limit, check_float, check_int, check_positive

__all__ = ["AIMDLimit"]


class AIMDLimit(Limit):
    """Loss-based limit: ``+1`` per busy success, ``× backoff_ratio`` per drop or slow sample."""

    __slots__ = ("backoff_ratio", "max_limit", "min_limit", "timeout")

    def __init__(
        self,
        *,
        initial_limit: int = defaults.AIMD_INITIAL_LIMIT,
        min_limit: int = defaults.AIMD_MIN_LIMIT,
        max_limit: int = defaults.AIMD_MAX_LIMIT,
        backoff_ratio: float = defaults.AIMD_BACKOFF_RATIO,
        timeout: float = defaults.AIMD_TIMEOUT,
    ) -> None:
        super().__init__(initial_limit)
        self.min_limit = check_int("min_limit", min_limit)
        self.max_limit = check_int("max_limit", max_limit)
        if self.max_limit < self.min_limit:
            raise ConfigError(f"max_limit must be >= min_limit ({min_limit}), got {max_limit!r}")
        self.backoff_ratio = check_float("backoff_ratio", backoff_ratio, 0.5, 1.0, open_high=True)
        self.timeout = check_positive("timeout", timeout)

    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        limit = self._limit
        if dropped or rtt > self.timeout:
            limit = int(limit * self.backoff_ratio)
        elif inflight * 2 >= limit:
            limit += 1
        return min(self.max_limit, max(self.min_limit, limit))
