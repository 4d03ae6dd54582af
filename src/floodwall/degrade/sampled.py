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

import dataclasses
import hashlib
import math
import random
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from floodwall._core import validate
from floodwall._core.admission import Flow
from floodwall._core.answer import Answer
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, kwargs, optional
from floodwall._core.steps import CALL, FlowSteps
from floodwall.degrade._common import mark_degraded

__all__ = ["SampledDrop", "SampledDropOptions", "key_fraction"]


_SPAN = float(2**64)


def _valid(ratio: object) -> bool:
    return isinstance(ratio, int | float) and not isinstance(ratio, bool) and 0 <= ratio <= 1


def _ratio(name: str, value: object) -> float | Callable[[], float]:
    """A drop ratio: a number in ``[0, 1]`` (as a float), or a callable read on every call."""
    if callable(value):
        return value
    if not _valid(value):  # (or a callable: the documented live form, refused above as a number)
        raise ConfigError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)  # type: ignore[arg-type]


def key_fraction(key: Hashable) -> float:
    """A stable fraction in ``[0, 1)`` for ``key`` (BLAKE2b of its ``str``, not Python's
    salted ``hash``): the same in every process and on every run."""
    digest = hashlib.blake2b(str(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SPAN


@dataclass(frozen=True, slots=True)
class SampledDropOptions:
    """A :class:`SampledDrop`'s options, validated once and replaced whole (never field by
    field): ``ratio`` (a number in ``[0, 1]``, default 0: drop nothing; or a callable read on
    every call), ``on_drop`` (the answer of a dropped call), ``drop_factory`` (or a callable of
    its arguments making that answer), ``key`` (a callable of the arguments: the same keys are
    dropped) and ``when`` (a predicate of the arguments: only those calls may be dropped).

    ``last`` is the ratio in force while ``ratio`` is a callable: its last good reading, kept
    in the object so that a reading taken under old options can never overwrite new ones.
    """

    ratio: float | Callable[[], float] = 0.0
    on_drop: Any = None
    drop_factory: Callable[..., Any] | None = None
    key: Callable[..., Hashable] | None = None
    when: Callable[..., bool] | None = None
    last: list[float] = field(init=False, default_factory=lambda: [0.0], compare=False, repr=False)

    CHECKS: ClassVar[Checks] = {
        "ratio": _ratio,
        "drop_factory": optional(partial(validate.function, what="a callable of the arguments")),
        "key": optional(partial(validate.function, what="a callable of the call's arguments")),
        "when": optional(partial(validate.function, what="a predicate of the call's arguments")),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if not callable(self.ratio):
            self.last[:] = [self.ratio]

    def read(self) -> tuple[float, bool]:
        """The ratio now and whether the reading was good (a callable's bad or failing
        reading keeps the last good one)."""
        source = self.ratio
        if not callable(source):
            return source, True
        try:
            value = source()
        except Exception:  # noqa: BLE001 - a broken config reader must not break the call
            value = math.nan
        if _valid(value):
            self.last[0] = float(value)
            return self.last[0], True
        return self.last[0], False


class SampledDrop(Flow):
    """Drop ``ratio`` of the calls it guards (see [Degradation][guide-degradation]).

    The options are one :class:`SampledDropOptions`, ``options``; :meth:`set_ratio` and
    :meth:`reconfigure` replace it in one assignment, and each call reads it once, so a call
    never judges by one setting's ratio and another's ``on_drop``, ``key`` or ``when``.

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
        self.options = SampledDropOptions(ratio, on_drop, drop_factory, key, when)
        """The options in force; :meth:`reconfigure` replaces the whole object at once."""
        self._lock = threading.Lock()
        self.rng = rng if rng is not None else random.Random()
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self.passed = 0
        self.dropped = 0
        self.ratio_errors = 0

    # -- the options ------------------------------------------------------------------------

    @property
    def on_drop(self) -> Any:
        return self.options.on_drop

    @property
    def drop_factory(self) -> Callable[..., Any] | None:
        return self.options.drop_factory

    @property
    def key(self) -> Callable[..., Hashable] | None:
        return self.options.key

    @property
    def when(self) -> Callable[..., bool] | None:
        return self.options.when

    def reconfigure(self, options: SampledDropOptions | None = None, /, **changes: Any) -> None:
        """Replace the options: ``options`` whole, and/or keyword ``changes`` over them (or
        over the options in force). Validated first (on a bad value nothing changes), then
        swapped in one assignment: a call sees the old options or the new ones, never a mix.
        A callable ratio keeps the last good reading of the options it replaces."""
        base = self.options if options is None else options
        if not isinstance(base, SampledDropOptions):
            raise ConfigError(f"options must be a SampledDropOptions, got {base!r}")
        unknown = set(changes) - set(kwargs(base))
        if unknown:
            raise ConfigError(f"unknown sampled drop option(s) {sorted(unknown)}")
        fresh = dataclasses.replace(base, **changes)
        with self._lock:  # one writer at a time: the last good reading carries over whole
            if callable(fresh.ratio):
                fresh.last[0] = self.options.last[0]
            self.options = fresh

    def set_ratio(self, ratio: float | Callable[[], float], *, announce: bool = True) -> None:
        """Change the ratio now: a number in ``[0, 1]``, or a callable read on every call
        (``reconfigure(ratio=ratio)``, then a ``ratio_changed`` event unless not ``announce``)."""
        announce = validate.flag("announce", announce, error=ValueError)
        self.reconfigure(ratio=ratio)
        if announce:
            self._emit("ratio_changed", f"drop ratio now {self.ratio:g}", {"ratio": self.ratio})

    @property
    def ratio(self) -> float:
        """The drop ratio in force (read from the callable when there is one)."""
        return self._read(self.options)

    def _read(self, options: SampledDropOptions) -> float:
        value, good = options.read()
        if not good:
            self.ratio_errors += 1
        return value

    # -- the decision -----------------------------------------------------------------------

    def should_drop(self, *args: Any, **kwargs: Any) -> bool:
        """Whether a call with these arguments is dropped now (counts nothing)."""
        return self._should_drop(self.options, args, kwargs)

    def _should_drop(
        self, o: SampledDropOptions, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> bool:
        when = o.when
        if when is not None and not when(*args, **kwargs):
            return False
        ratio = o.ratio
        if ratio.__class__ is not float:  # a live callable (a fixed ratio is kept as a float)
            ratio = self._read(o)
        if ratio <= 0:
            return False
        if ratio >= 1:
            return True
        if o.key is not None:
            return key_fraction(o.key(*args, **kwargs)) < ratio
        with self._lock:  # random.Random is not documented as thread-safe
            return self.rng.random() < ratio

    def _drop(self, o: SampledDropOptions, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.dropped += 1
        mark_degraded(self.name, "sampled")
        self._emit("dropped", "sampled away", {"ratio": o.last[0]})
        if o.drop_factory is not None:
            return o.drop_factory(*args, **kwargs)
        return o.on_drop

    # -- the flow ---------------------------------------------------------------------------

    def flow(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlowSteps:
        """Answer for a dropped call, or make it (by the options in force when it began)."""
        o = self.options
        if self._should_drop(o, args, kwargs):
            return (yield Answer(self._drop(o, args, kwargs)))
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
        ratio = self.options.ratio
        live = "live" if callable(ratio) else f"{ratio:g}"
        return f"SampledDrop({self.name!r}, ratio={live})"
