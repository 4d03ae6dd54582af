"""SampledDrop: drop a share of low-priority writes, with the share tunable live.

The seeds' live-stream comments ("danmaku seen only by its sender"): with a million viewers and
a hundred comments a second, broadcasting every comment costs a hundred million messages a
second. Under pressure the client shows the sender's comment locally and sends only a share of
comments to the server, and the share is tuned live from the config centre as the service
copes. Nobody minds: in a busy room a comment scrolls away in a second anyway.

``SampledDrop(ratio)`` is a policy: a call is **dropped** with probability ``ratio`` (the
function does not run; the call answers ``on_drop``, or ``drop_factory(*args, **kwargs)``), or
**passed** to the function. The ratio is live:

* ``drop.set_ratio(0.9)`` (validated: in ``[0, 1]``), e.g. from a config listener or the admin
  API; or
* ``ratio=callable`` read on every call (a config value, a flag); a reading outside
  ``[0, 1]`` is counted in ``ratio_errors`` and the last good ratio is used.

``key=`` makes the choice stable per key (a user id: the same users are dropped, and raising
the ratio only adds users): the key's BLAKE2b hash, as a fraction of 2⁶⁴, is compared with
the ratio. Without ``key`` each call draws from ``rng`` (inject a seeded ``random.Random`` for
reproducible tests). ``when=`` restricts dropping to the calls it returns true for (say, level-3
writes); the others always pass.

Counters ``passed`` and ``dropped``; each drop emits a ``dropped`` event and marks the open
:func:`floodwall.call_context` as degraded (reason ``"sampled"``).
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from floodwall._core import validate
from floodwall._core.admission import Flow
from floodwall._core.answer import Answer
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.steps import CALL, FlowSteps
from floodwall.degrade._common import mark_degraded

__all__ = ["SampledDrop", "key_fraction"]


_SPAN = float(2**64)


def _valid(ratio: object) -> bool:
    return isinstance(ratio, int | float) and not isinstance(ratio, bool) and 0 <= ratio <= 1


def key_fraction(key: Hashable) -> float:
    """A stable fraction in ``[0, 1)`` for ``key`` (BLAKE2b of its ``str``, not Python's
    salted ``hash``): the same in every process and on every run."""
    digest = hashlib.blake2b(str(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SPAN


class SampledDrop(Flow):
    """Drop ``ratio`` of the calls it guards (see [Degradation][guide-degradation]).

    As a flow: a dropped call is one :class:`~floodwall._core.answer.Answer` step (``on_drop``,
    or what ``drop_factory`` returns, awaited in async calls when it is awaitable); a passed
    call is one :data:`~floodwall._core.steps.CALL`.
    """

    kind = "sampled_drop"

    def __init__(
        self,
        ratio: float | Callable[[], float] = 0.0,
        *,
        on_drop: Any = None,
        drop_factory: Callable[..., Any] | None = None,
        key: Callable[..., Hashable] | None = None,
        when: Callable[..., bool] | None = None,
        rng: random.Random | None = None,
        name: str = "sampled_drop",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self._source: Callable[[], float] | None = None
        self._ratio = 0.0
        self._lock = threading.Lock()
        self.set_ratio(ratio, announce=False)
        self.on_drop = on_drop
        if drop_factory is not None:
            validate.function("drop_factory", drop_factory, what="a callable of the arguments")
        if key is not None:
            validate.function("key", key, what="a callable of the call's arguments")
        self.drop_factory = drop_factory
        self.key = key
        if when is not None:
            validate.function("when", when, what="a predicate of the call's arguments")
        self.when = when
        self.rng = rng if rng is not None else random.Random()
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self.passed = 0
        self.dropped = 0
        self.ratio_errors = 0

    # -- the ratio --------------------------------------------------------------------------

    def set_ratio(self, ratio: float | Callable[[], float], *, announce: bool = True) -> None:
        """Change the ratio now: a number in ``[0, 1]``, or a callable read on every call."""
        if callable(ratio):
            self._source = ratio
        elif _valid(ratio):
            self._source = None
            self._ratio = float(ratio)
        else:
            raise ConfigError(f"ratio must be a number in [0, 1], got {ratio!r}")
        if validate.flag("announce", announce, error=ValueError):
            self._emit("ratio_changed", f"drop ratio now {self.ratio:g}", {"ratio": self.ratio})

    @property
    def ratio(self) -> float:
        """The drop ratio in force (read from the callable when there is one)."""
        source = self._source
        if source is None:
            return self._ratio
        try:
            value = source()
        except Exception:  # noqa: BLE001 - a broken config reader must not break the call
            value = math.nan
        if _valid(value):
            self._ratio = float(value)
        else:
            self.ratio_errors += 1
        return self._ratio

    # -- the decision -----------------------------------------------------------------------

    def should_drop(self, *args: Any, **kwargs: Any) -> bool:
        """Whether a call with these arguments is dropped now (counts nothing)."""
        if self.when is not None and not self.when(*args, **kwargs):
            return False
        ratio = self.ratio
        if ratio <= 0:
            return False
        if ratio >= 1:
            return True
        if self.key is not None:
            return key_fraction(self.key(*args, **kwargs)) < ratio
        with self._lock:  # random.Random is not documented as thread-safe
            return self.rng.random() < ratio

    def _drop(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.dropped += 1
        mark_degraded(self.name, "sampled")
        self._emit("dropped", "sampled away", {"ratio": self._ratio})
        if self.drop_factory is not None:
            return self.drop_factory(*args, **kwargs)
        return self.on_drop

    # -- the flow ---------------------------------------------------------------------------

    def flow(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlowSteps:
        """Answer for a dropped call, or make it."""
        if self.should_drop(*args, **kwargs):
            return (yield Answer(self._drop(args, kwargs)))
        self.passed += 1
        return (yield CALL)

    def snapshot(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "passed": self.passed,
            "dropped": self.dropped,
            "ratio_errors": self.ratio_errors,
        }

    def _emit(self, kind: str, reason: str, figures: dict[str, Any]) -> None:
        if self.listeners:
            now = self.clock.monotonic()
            self.listeners.emit(Event(kind, self.kind, self.name, now, reason, figures=figures))

    def describe(self) -> str:
        live = "live" if self._source is not None else f"{self._ratio:g}"
        return f"SampledDrop({self.name!r}, ratio={live})"
