"""Telemetry through one listener interface.

A policy holds a :class:`Listeners` list. When nobody listens, emitting costs one truth test and
builds nothing; when somebody does, each listener receives an immutable :class:`Event`. A listener
that raises never breaks the call it observes (the first law: the protection layer must not become
the failure source); the error is counted in ``Listeners.errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["Event", "EventListener", "Listeners"]

EventListener = Callable[["Event"], None]
"""Anything callable with one :class:`Event`."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Event:
    """Something a policy decided, with the reason and the figures behind it.

    ``kind`` names the event (``"state_change"``, ``"rejected"``, ``"timeout"``, ``"fallback"``,
    …); ``source`` is the policy class (``"circuit_breaker"``), ``name`` the policy instance's name.
    For state changes ``from_state``/``to_state`` are set. ``figures`` carries the numbers that
    caused the decision, ``time`` the policy clock's reading.
    """

    kind: str
    source: str
    name: str
    time: float
    reason: str = ""
    from_state: str | None = None
    to_state: str | None = None
    figures: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def __str__(self) -> str:
        head = f"{self.source}[{self.name}] {self.kind}"
        if self.from_state is not None:
            head += f" {self.from_state} -> {self.to_state}"
        return f"{head}: {self.reason}" if self.reason else head


class Listeners:
    """An ordered set of listeners; falsy when empty so emitters can skip building events.

    ``Listeners(existing)`` with a ``Listeners`` instance returns that same instance: policies
    built by a registry share the registry's set, so they build no event while nobody listens
    and start emitting as soon as somebody subscribes.
    """

    __slots__ = ("_items", "errors")

    def __new__(cls, listeners: Iterable[EventListener] = ()) -> Listeners:
        if isinstance(listeners, Listeners):
            return listeners
        return super().__new__(cls)

    def __init__(self, listeners: Iterable[EventListener] = ()) -> None:
        if listeners is self:
            return  # shared, already initialised
        self._items: tuple[EventListener, ...] = tuple(listeners)
        self.errors = 0

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[EventListener]:
        return iter(self._items)

    def add(self, listener: EventListener) -> None:
        """Subscribe ``listener`` (copy-on-write, so emitting never takes a lock)."""
        if not callable(listener):
            raise TypeError(f"listener must be callable (an EventListener), got {listener!r}")
        if listener not in self._items:
            self._items = (*self._items, listener)

    def remove(self, listener: EventListener) -> None:
        """Unsubscribe ``listener``; unknown listeners are ignored."""
        if not callable(listener):
            raise TypeError(f"listener must be callable (an EventListener), got {listener!r}")
        self._items = tuple(item for item in self._items if item != listener)

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to every listener; a failing listener is counted, never raised."""
        for listener in self._items:
            try:
                listener(event)
            except Exception:  # noqa: BLE001 - observers must never break the observed call
                self.errors += 1
