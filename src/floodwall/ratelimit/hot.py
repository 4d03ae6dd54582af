"""Per-value thresholds for hot keys: Sentinel's parameter flow control with its exceptions.

``HotKeys(Keyed(TokenBucket("10/s")), {"vip": TokenBucket("100/s"), "bot": TokenBucket("1/s")})``
limits every key to 10/s except the listed values, each of which gets its own limiter (Sentinel's
``ParamFlowRule`` with ``paramFlowItemList``: one rule, a per-value count for known hot values).

Why a separate router rather than an option of :class:`~floodwall.ratelimit.Keyed`: a listed
value is not a key that comes and goes but one the operator named, so it is never evicted and
never counts against ``max_keys``, and tracked keys keep Keyed's one-lookup path untouched. A
listed value is decided by its own limiter (its own lock, its own rejections and events); every
other key by the keyed default.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from floodwall._core.errors import ConfigError
from floodwall._core.events import EventListener
from floodwall._core.steps import FlowSteps
from floodwall.ratelimit._base import Decision, RateLimiter
from floodwall.ratelimit.keyed import Keyed

__all__ = ["HotKeys"]


class HotKeys(RateLimiter[Any]):
    """Route listed key values to their own limiter, every other key to ``default``."""

    algorithm = "hot_keys"

    def __init__(
        self,
        default: Keyed[Any],
        hot: Mapping[Hashable, RateLimiter[Any]],
        *,
        key: Callable[..., Hashable] | None = None,
        name: str | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        if not isinstance(default, Keyed):
            raise ConfigError(f"default must be a Keyed limiter, got {default!r}")
        for value, limiter in hot.items():
            if not isinstance(limiter, RateLimiter) or isinstance(limiter, Keyed | HotKeys):
                raise ConfigError(
                    f"hot[{value!r}] must be a plain (unkeyed) RateLimiter, got {limiter!r}"
                )
        self.default = default
        self.hot: dict[Hashable, RateLimiter[Any]] = dict(hot)
        self.key = key if key is not None else default.key
        self.limit = default.limit
        self.window = default.window
        super().__init__(
            name=f"{default.name}[hot]" if name is None else name,
            clock=default.clock,
            max_wait=default.max_wait,
            listeners=listeners,
        )

    # -- the core is the default's (unused: every shell routes) ------------------------------

    def _new_state(self, now: float) -> Any:
        return None

    def _check(self, st: Any, now: float, cost: float) -> bool:  # pragma: no cover - routed
        raise NotImplementedError

    def _commit(self, st: Any, now: float, cost: float) -> None:  # pragma: no cover - routed
        raise NotImplementedError

    def _figures(  # pragma: no cover - routed
        self, st: Any, now: float, cost: float, allowed: bool
    ) -> Decision:
        raise NotImplementedError

    def _idle_at(self, st: Any) -> float:  # pragma: no cover - routed
        raise NotImplementedError

    # -- routing ----------------------------------------------------------------------------

    def route(self, key: Hashable) -> tuple[RateLimiter[Any], Hashable]:
        """The limiter that decides ``key`` and the key to ask it with."""
        limiter = self.hot.get(key)
        return (self.default, key) if limiter is None else (limiter, None)

    def try_acquire(self, key: Hashable = None, cost: float = 1) -> bool:
        limiter, inner = self.route(key)
        return limiter.try_acquire(inner, cost)

    def acquire(self, key: Hashable = None, cost: float = 1) -> Decision:
        limiter, inner = self.route(key)
        return limiter.acquire(inner, cost)

    def peek(self, key: Hashable = None, cost: float = 1) -> Decision:
        limiter, inner = self.route(key)
        return limiter.peek(inner, cost)

    def reset(self, key: Hashable = None) -> None:
        limiter, inner = self.route(key)
        limiter.reset(inner)

    def _wait_steps(self, key: Hashable, cost: float, max_wait: float | None) -> FlowSteps:
        limiter, inner = self.route(key)
        return limiter._wait_steps(inner, cost, max_wait)

    def _admit(self, key: Hashable, cost: float = 1) -> Decision | None:
        limiter, inner = self.route(key)
        return limiter._admit(inner, cost)

    def _call_key(self, args: tuple[object, ...], kwargs: dict[str, object]) -> Hashable:
        return None if self.key is None else self.key(*args, **kwargs)

    @property
    def rejected(self) -> int:
        """Requests refused, by the default and by every hot value's limiter."""
        return self.default.rejected + sum(limiter.rejected for limiter in self.hot.values())

    def describe(self) -> str:
        if not hasattr(self, "hot"):
            return "HotKeys()"
        listed = ", ".join(
            f"{value!r}: {limiter.describe()}" for value, limiter in self.hot.items()
        )
        return f"HotKeys({self.default.describe()}, hot={{{listed}}})"
