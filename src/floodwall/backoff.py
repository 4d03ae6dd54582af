"""Backoff strategies: how long to wait before retry 1, 2, 3, …

Each strategy is a small frozen object whose :meth:`~Backoff.delays` returns a fresh, endless
iterator of seconds: the first value is the wait before the first retry. A
:class:`~floodwall.Retry` draws one iterator per failing call and stops drawing when it stops
retrying, so strategies never need to know the attempt limit.

Every strategy takes ``cap`` (no delay is ever longer; default unbounded for the plain shapes,
:data:`~floodwall._core.defaults.RETRY_BACKOFF_CAP` for the exponential family) and the random
ones an injectable ``rng`` (anything with ``random() -> float`` in ``[0, 1)``, such as a seeded
:class:`random.Random`). Which rng a random strategy uses: its own ``rng`` if set, else the one
passed to ``delays(rng)`` (a ``Retry(rng=...)`` passes its own), else a module-level
:class:`random.Random`.

The exponential family follows Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture
Blog, 2015 (https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/), with the
retry number ``n`` counted from 1 (the blog counts attempts from 0, so its ``2 ** attempt`` is
our ``2 ** (n - 1)``):

==================  =================================================================
``Exponential``     ``min(cap, base × m^(n−1))``
``FullJitter``      ``uniform(0, min(cap, base × m^(n−1)))``
``EqualJitter``     ``v/2 + uniform(0, v/2)`` with ``v = min(cap, base × m^(n−1))``
``DecorrelatedJitter`` ``s₀ = base``; ``sₙ = min(cap, uniform(base, 3 × sₙ₋₁))``
``Randomized``      ``min(cap, v × uniform(1 − f, 1 + f))``, ``v`` as above, ``f`` the factor
==================  =================================================================

:class:`Randomized` is resilience4j's ``IntervalFunction.ofExponentialRandomBackoff``: the
exponential interval spread ± ``randomization_factor`` around its value. Unlike resilience4j it
never waits longer than ``cap`` (resilience4j randomizes after capping, so its longest wait is
``max × (1 + f)``).

The blog's simulation (reproduced by ``benchmarks/jitter_sim.py``) shows why jitter matters:
clients that back off in lockstep collide again on every retry, so un-jittered exponential
backoff needs several times the calls of full jitter under contention. Full jitter is the
default of :class:`~floodwall.Retry`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from floodwall._core import defaults
from floodwall._core.errors import ConfigError
from floodwall._core.validate import number
from floodwall._core.validate import seconds as _seconds

__all__ = [
    "Backoff",
    "DecorrelatedJitter",
    "EqualJitter",
    "Exponential",
    "Fixed",
    "FullJitter",
    "Linear",
    "NoBackoff",
    "Randomized",
    "Rng",
    "Uniform",
]

_INF = math.inf


class Rng(Protocol):
    """A source of uniform floats in ``[0, 1)``: :class:`random.Random` fits."""

    def random(self) -> float: ...


_DEFAULT_RNG: Rng = random.Random()
"""Shared by random strategies that were given no rng (jitter needs no cryptographic quality)."""


@runtime_checkable
class Backoff(Protocol):
    """A strategy: ``delays(rng)`` yields the seconds to wait before retry 1, 2, … forever."""

    def delays(self, rng: Rng | None = None) -> Iterator[float]: ...


def _multiplier(name: str, value: float) -> float:
    return number(name, value, 1.0)


def _pick(own: Rng | None, given: Rng | None) -> Rng:
    if own is not None:
        return own
    return given if given is not None else _DEFAULT_RNG


def _growing(base: float, multiplier: float, cap: float) -> Iterator[float]:
    """``min(cap, base × multiplier^(n−1))`` for n = 1, 2, …; stops multiplying at the cap,
    so it never overflows."""
    value = base
    while value < cap:
        yield value
        value *= multiplier
    while True:
        yield cap


@dataclass(frozen=True, slots=True)
class NoBackoff:
    """Retry at once: every delay is 0.

    Only for errors known to clear instantly (a dropped pooled connection); anything that
    can be overloaded wants a delay.
    """

    def delays(self, rng: Rng | None = None) -> Iterator[float]:
        del rng
        while True:
            yield 0.0


@dataclass(frozen=True, slots=True)
class Fixed:
    """Wait ``min(cap, delay)`` seconds before every retry."""

    delay: float
    cap: float = _INF

    def __post_init__(self) -> None:
        object.__setattr__(self, "delay", _seconds("delay", self.delay))
        object.__setattr__(self, "cap", _seconds("cap", self.cap, infinite=True))

    def delays(self, rng: Rng | None = None) -> Iterator[float]:
        del rng
        value = min(self.cap, self.delay)
        while True:
            yield value


@dataclass(frozen=True, slots=True)
class Linear:
    """Retry ``n`` waits ``min(cap, base + step × (n − 1))``; ``step`` defaults to ``base``
    (0.1, 0.2, 0.3, … for ``base=0.1``)."""

    base: float
    step: float | None = None
    cap: float = _INF

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", _seconds("base", self.base))
        step = self.base if self.step is None else _seconds("step", self.step)
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "cap", _seconds("cap", self.cap, infinite=True))

    def delays(self, rng: Rng | None = None) -> Iterator[float]:
        del rng
        base, step, cap = self.base, self.step or 0.0, self.cap
        n = 0
        while True:
            value = base + step * n
            if value >= cap:
                break
            yield value
            n += 1
        while True:
            yield cap


@dataclass(frozen=True, slots=True)
class Uniform:
    """Each retry waits ``min(cap, uniform(low, high))``, independently drawn.

    Spreads a crowd of retries over a range, but does not grow when the dependency stays
    down; prefer :class:`FullJitter` for anything that can be overloaded.
    """

    low: float
    high: float
    cap: float = _INF
    rng: Rng | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        low = _seconds("low", self.low)
        high = _seconds("high", self.high)
        if high < low:
            raise ConfigError(f"high must be >= low ({low!r}), got {high!r}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "cap", _seconds("cap", self.cap, infinite=True))

    def delays(self, rng: Rng | None = None) -> Iterator[float]:
        draw = _pick(self.rng, rng).random
        low, span, cap = self.low, self.high - self.low, self.cap
        while True:
            value = low + span * draw()
            yield min(cap, value)


@dataclass(frozen=True, slots=True)
class Exponential:
    """Retry ``n`` waits ``min(cap, base × multiplier^(n−1))``: 0.1, 0.2, 0.4, … by default.

    Without jitter every client that failed together retries together; use it only when one
    caller is alone on its dependency. (AWS blog, "Exponential Backoff And Jitter".)
    """

    base: float = defaults.RETRY_BACKOFF_BASE
    multiplier: float = 2.0
    cap: float = defaults.RETRY_BACKOFF_CAP

    def __post_init__(self) -> None:
        _check_exponential(self)

    def delays(self, rng: Rng | None = None) -> Iterator[float]:
        del rng
        return _growing(self.base, self.multiplier, self.cap)


def _check_exponential(strategy: Exponential | FullJitter | EqualJitter | Randomized) -> None:
    base = _seconds("base", strategy.base, positive=True)
    object.__setattr__(strategy, "base", base)
    object.__setattr__(strategy, "multiplier", _multiplier("multiplier", strategy.multiplier))
    object.__setattr__(strategy, "cap", _seconds("cap", strategy.cap, infinite=True))


@dataclass(frozen=True, slots=True)
class FullJitter:
    """Retry ``n`` waits ``uniform(0, min(cap, base × multiplier^(n−1)))``.

    The AWS blog's recommendation: the fewest calls and close to the shortest completion time
    of its contention simulation, because clients spread over the whole interval.
    """

    base: float = defaults.RETRY_BACKOFF_BASE
    multiplier: float = 2.0
    cap: float = defaults.RETRY_BACKOFF_CAP
    rng: Rng | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_exponential(self)

    def delays(self, rng: Rng | None = None) -> Iterator[float]:
        draw = _pick(self.rng, rng).random
        for ceiling in _growing(self.base, self.multiplier, self.cap):
            yield ceiling * draw()


@dataclass(frozen=True, slots=True)
class EqualJitter:
    """Retry ``n`` waits ``v/2 + uniform(0, v/2)`` with ``v = min(cap, base × multiplier^(n−1))``.

    Keeps at least half of the exponential wait (never retries almost at once), at the price
    of more calls than full jitter in the AWS blog's simulation.
    """

    base: float = defaults.RETRY_BACKOFF_BASE
    multiplier: float = 2.0
    cap: float = defaults.RETRY_BACKOFF_CAP
    rng: Rng | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_exponential(self)

    def delays(self, rng: Rng | None = None) -> Iterator[float]:
        draw = _pick(self.rng, rng).random
        for ceiling in _growing(self.base, self.multiplier, self.cap):
            half = ceiling / 2
            yield half + half * draw()


@dataclass(frozen=True, slots=True)
class DecorrelatedJitter:
    """``s₀ = base``; retry ``n`` waits ``sₙ = min(cap, uniform(base, multiplier × sₙ₋₁))``.

    The AWS blog's "decorrelated jitter" (``multiplier`` 3 as there): each wait grows from the
    previous *drawn* wait rather than from the retry number. Every delay lies in
    ``[min(base, cap), cap]``.
    """

    base: float = defaults.RETRY_BACKOFF_BASE
    cap: float = defaults.RETRY_BACKOFF_CAP
    multiplier: float = 3.0
    rng: Rng | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        base = _seconds("base", self.base, positive=True)
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "cap", _seconds("cap", self.cap, infinite=True))
        object.__setattr__(self, "multiplier", _multiplier("multiplier", self.multiplier))

    def delays(self, rng: Rng | None = None) -> Iterator[float]:
        draw = _pick(self.rng, rng).random
        base, cap, multiplier = self.base, self.cap, self.multiplier
        sleep = base
        while True:
            high = sleep * multiplier
            sleep = base + (high - base) * draw()
            sleep = min(sleep, cap)
            yield sleep


@dataclass(frozen=True, slots=True)
class Randomized:
    """Retry ``n`` waits ``min(cap, v × uniform(1 − f, 1 + f))`` with
    ``v = min(cap, base × multiplier^(n−1))`` and ``f = randomization_factor`` in ``[0, 1)``.

    resilience4j's exponential random backoff (default factor 0.5, as there): delays keep the
    exponential's shape on average, so a migrated configuration waits as long as before,
    while the spread still breaks lockstep retries.
    """

    base: float = defaults.RETRY_BACKOFF_BASE
    multiplier: float = 2.0
    randomization_factor: float = 0.5
    cap: float = defaults.RETRY_BACKOFF_CAP
    rng: Rng | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_exponential(self)
        factor = self.randomization_factor
        if not 0 <= factor < 1:
            raise ConfigError(f"randomization_factor must be in [0, 1), got {factor!r}")
        object.__setattr__(self, "randomization_factor", float(factor))

    def delays(self, rng: Rng | None = None) -> Iterator[float]:
        draw = _pick(self.rng, rng).random
        low, span, cap = 1.0 - self.randomization_factor, 2.0 * self.randomization_factor, self.cap
        for value in _growing(self.base, self.multiplier, self.cap):
            yield min(cap, value * (low + span * draw()))
