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

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError
from floodwall._core.options import Checks, check_all
from floodwall.adaptive._base import Limit

__all__ = ["AIMDLimit", "AIMDOptions"]


@dataclass(frozen=True, slots=True)
class AIMDOptions:
    """An :class:`AIMDLimit`'s options (the Java builder's defaults), validated once.

    ``backoff_ratio`` is in ``[0.5, 1)``; ``timeout`` is seconds (> 0); ``max_limit`` must be
    at least ``min_limit``.
    """

    initial_limit: int = defaults.AIMD_INITIAL_LIMIT
    min_limit: int = defaults.AIMD_MIN_LIMIT
    max_limit: int = defaults.AIMD_MAX_LIMIT
    backoff_ratio: float = defaults.AIMD_BACKOFF_RATIO
    timeout: float = defaults.AIMD_TIMEOUT

    CHECKS: ClassVar[Checks] = {
        "initial_limit": validate.count,
        "min_limit": validate.count,
        "max_limit": validate.count,
        "backoff_ratio": partial(validate.number, low=0.5, high=1.0, high_open=True),
        "timeout": partial(validate.seconds, positive=True),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if self.max_limit < self.min_limit:
            raise ConfigError(
                f"max_limit must be >= min_limit ({self.min_limit}), got {self.max_limit!r}"
            )


class AIMDLimit(Limit):
    """Loss-based limit: ``+1`` per busy success, ``× backoff_ratio`` per drop or slow sample.

    ``options`` holds the validated :class:`AIMDOptions`; the fields the update reads are
    copied from it once, at construction."""

    __slots__ = ("backoff_ratio", "max_limit", "min_limit", "options", "timeout")

    def __init__(
        self,
        *,
        initial_limit: int = defaults.AIMD_INITIAL_LIMIT,
        min_limit: int = defaults.AIMD_MIN_LIMIT,
        max_limit: int = defaults.AIMD_MAX_LIMIT,
        backoff_ratio: float = defaults.AIMD_BACKOFF_RATIO,
        timeout: float = defaults.AIMD_TIMEOUT,
    ) -> None:
        self.options = o = AIMDOptions(initial_limit, min_limit, max_limit, backoff_ratio, timeout)
        super().__init__(o.initial_limit)
        self.min_limit = o.min_limit
        self.max_limit = o.max_limit
        self.backoff_ratio = o.backoff_ratio
        self.timeout = o.timeout

    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        limit = self._limit
        if dropped or rtt > self.timeout:
            limit = int(limit * self.backoff_ratio)
        elif inflight * 2 >= limit:
            limit += 1
        return min(self.max_limit, max(self.min_limit, limit))
