"""The one outcome vocabulary: how a call ended, and which outcomes a policy option selects.

Every call ends in one **kind** (:class:`Kind`, stable numbers for windows and metrics):

* ``success``: it returned a value;
* ``error``: it raised, or returned a value an option selects as failed (an HTTP 503 response);
* ``timeout``: it ran out of time (any :class:`TimeoutError`, floodwall's
  :class:`~floodwall.TimeoutExceeded` included);
* ``rejected``: a floodwall policy refused it (a :class:`~floodwall.RejectedError` that is not a
  timeout); each rejection also has its own kind (``circuit_open``, ``bulkhead_full``,
  ``rate_limited``, ``overloaded``, ``degraded``, …: :attr:`RejectedError.kind`);
* ``ignored``: counted nowhere (a business error a breaker was told to ignore).

``slow`` is not a kind but a success that took longer than a policy's slow-call duration; the
rolling windows count it beside the kind. For retries, an error also has a **class**
(:class:`ErrorClass`: ``business``, ``overload``, ``transient``, ``unknown``), which
:class:`~floodwall.Classifier` decides.

Options that say "which outcomes count" are all spellings of :class:`Outcomes`: a breaker's
``record=`` and ``ignore=``, a retry's ``retry_on=`` and ``business=``, an adaptive limiter's
``drop_on=``, a fallback's, cache's or fallback source's ``on=`` and ``kinds=``. Each takes an
exception type, a tuple of them, or an :class:`Outcomes`, which also selects by kind.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from floodwall._core import validate
from floodwall._core.errors import ConfigError, RejectedError

__all__ = ["ANY_ERROR", "ERROR_KINDS", "NOTHING", "ErrorClass", "Kind", "Outcomes", "kind_of"]


class Kind(enum.IntEnum):
    """How a call ended, as windows and metrics count it. Numbers are stable."""

    SUCCESS = 0
    FAILURE = 1
    """An error: an exception, or a result an option selects as failed (an HTTP 503 value)."""
    TIMEOUT = 2
    """The call ran out of time."""
    REJECTED = 3
    """A floodwall policy (e.g. a full bulkhead) refused the call."""
    IGNORED = 4
    """Counted nowhere: an exception the policy was told to ignore, such as a business error."""


class ErrorClass(enum.IntEnum):
    """What a retry can do about a failure. The numbers are stable for metrics."""

    TRANSIENT = 0
    """Random and short-lived (a reset connection, a timeout): retried with backoff."""
    OVERLOAD = 1
    """The dependency asked for less traffic: not retried, or only after its ``retry_after``."""
    BUSINESS = 2
    """The same request gets the same answer: never retried."""
    UNKNOWN = 3
    """None of the above: retried only when listed in ``Retry(retry_on=...)``."""


ERROR_KINDS = frozenset({"error", "timeout", "rejected"})
"""The kinds an error can have; a rejection's own kind (``circuit_open``, …) refines
``rejected`` (or ``timeout``, for :class:`~floodwall.TimeoutExceeded`)."""

_NOT_ERROR_KINDS = {
    "success": "a success is not an error",
    "ignored": "ignored is what an option decides, not a kind to select",
    "slow": "slow is a duration (a slow-call rule), not an error kind",
    **dict.fromkeys(
        (c.name.lower() for c in ErrorClass),
        "error classes are Retry's (retry_on=, business=, classifier=), not kinds",
    ),
}


def kind_of(exc: BaseException) -> Kind:
    """The kind of an error: TIMEOUT, REJECTED or FAILURE (by type, nothing else)."""
    if isinstance(exc, TimeoutError):
        return Kind.TIMEOUT
    if isinstance(exc, RejectedError):
        return Kind.REJECTED
    return Kind.FAILURE


def _error_kind(exc: BaseException, name: str) -> bool:
    if name == "timeout":
        return isinstance(exc, TimeoutError)
    if name == "rejected":
        return isinstance(exc, RejectedError) and not isinstance(exc, TimeoutError)
    if name == "error":
        return isinstance(exc, Exception) and kind_of(exc) is Kind.FAILURE
    return isinstance(exc, RejectedError) and exc.kind == name


@dataclass(frozen=True, slots=True)
class Outcomes:
    """A set of outcomes, as a policy option selects them (see :mod:`floodwall._core.outcome`).

    An error is selected when it is an instance of one of ``types`` or has one of ``kinds``
    (``error``, ``timeout``, ``rejected``, or a rejection's own kind such as ``circuit_open``);
    a returned value when ``result(value)`` is true. ``Outcomes()`` selects nothing;
    ``Outcomes(types=(Exception,))`` every error but cancellation.
    """

    types: tuple[type[BaseException], ...] = ()
    kinds: frozenset[str] = frozenset()
    result: Callable[[Any], bool] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "types", validate.exception_types("types", self.types))
        object.__setattr__(self, "kinds", _kinds("kinds", self.kinds))
        if self.result is not None:
            validate.function("result", self.result, what="a predicate on the result")

    @classmethod
    def of(cls, name: str, value: object, *, kinds: Collection[str] | None = None) -> Outcomes:
        """The :class:`Outcomes` an option spells: ``value`` is an exception type, a tuple of
        them or an :class:`Outcomes`; ``kinds`` (the ``kinds=`` option beside ``on=``) adds
        kinds. Errors name the option ``name``."""
        extra = _kinds("kinds", kinds) if kinds is not None else frozenset()
        if isinstance(value, Outcomes):
            return value if not extra else cls(value.types, value.kinds | extra, value.result)
        return cls(validate.exception_types(name, value), extra)

    @classmethod
    def handled(cls, on: object, kinds: Collection[str] | None) -> Outcomes:
        """What a fallback, cache or fallback source answers for: ``on=`` (exception types or
        an :class:`Outcomes`) and/or ``kinds=``, either matching; neither given: any
        ``Exception`` (never cancellation or ``KeyboardInterrupt``)."""
        if on is None and kinds is None:
            return ANY_ERROR
        return cls.of("on", () if on is None else on, kinds=kinds)

    def __bool__(self) -> bool:
        """Whether anything at all is selected."""
        return bool(self.types or self.kinds or self.result is not None)

    def error(self, exc: BaseException) -> bool:
        """Whether the error ``exc`` is selected."""
        if self.types and isinstance(exc, self.types):
            return True
        return any(_error_kind(exc, name) for name in self.kinds)

    def value(self, result: object) -> bool:
        """Whether the returned ``result`` is selected (as failed)."""
        return self.result is not None and bool(self.result(result))


def _kinds(name: str, value: object) -> frozenset[str]:
    """Kind names as a frozenset: a collection of non-empty strings (not one bare string)."""
    if isinstance(value, str | bytes) or not isinstance(value, Collection):
        raise ConfigError(
            f"{name} must be a collection of kinds such as {{'timeout', 'circuit_open'}}, "
            f"got {value!r}"
        )
    for item in value:
        validate.text(f"{name} items", item)
        why = _NOT_ERROR_KINDS.get(item)
        if why is not None:
            raise ConfigError(f"{name} must name error kinds, got {item!r}: {why}")
    return frozenset(value)


ANY_ERROR = Outcomes(types=(Exception,))
"""Every error but cancellation and interpreter exits."""
NOTHING = Outcomes()
"""No outcome at all."""
