"""Argument checks shared by every policy, option object and method: one wording per mistake.

An error names the parameter, the constraint and the value (STYLE.md #12)::

    minimum_calls must be an integer >= 1, got 0
    max_wait must be a finite number of seconds >= 0, got nan
    record must be an exception type or a tuple of them, got 42

Options are checked once, at construction (:class:`~floodwall.ConfigError`); a method argument
is checked at the call with ``error=ValueError``. The checks refuse what Python would let
through and turn into a wrong answer later: ``bool`` where a number is asked (``True`` is 1),
NaN (every comparison with it is false), infinity where only a finite number makes sense, and a
type that fails only on first use. Every function returns the value, normalised (``float`` for
numbers, a tuple for exception types), so a caller writes ``self.x = seconds("x", x)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from floodwall._core.errors import ConfigError

__all__ = [
    "choice",
    "codec",
    "count",
    "exception_types",
    "flag",
    "function",
    "instance",
    "integer",
    "number",
    "seconds",
    "share",
    "text",
]

T = TypeVar("T")
_INF = math.inf
PLAIN_INT: type = int
"""``int``, typed as any type: ``x.__class__ is not PLAIN_INT`` sends every argument but a plain
int (a bool, a float, NaN, a string) to the full check, one identity test on a hot path (with
``x: int`` or ``x: float`` a type checker would conclude the test can never be true)."""
_Error = type[Exception]


def _fail(error: _Error, name: str, constraint: str, value: object) -> Exception:
    return error(f"{name} must be {constraint}, got {value!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def count(
    name: str,
    value: object,
    minimum: int = 1,
    maximum: int | None = None,
    *,
    error: _Error = ConfigError,
) -> int:
    """``value`` if it is an integer (not a bool) in ``[minimum, maximum]``."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise _fail(error, name, f"an integer {bound}", value)
    return value


def integer(name: str, value: object, *, error: _Error = ConfigError) -> int:
    """``value`` if it is an integer (not a bool), of any sign."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(error, name, "an integer", value)
    return value


def number(
    name: str,
    value: object,
    low: float = -_INF,
    high: float = _INF,
    *,
    low_open: bool = False,
    high_open: bool = False,
    infinite: bool = False,
    unit: str = "",
    error: _Error = ConfigError,
) -> float:
    """``value`` as a float in the interval from ``low`` to ``high`` (closed unless
    ``low_open``/``high_open``), finite unless ``infinite`` (then ``high`` may be ``inf``).

    NaN is always refused; so are ``bool`` and strings (``"60"`` is a string, not 60 s).
    """
    number = float(value) if _is_number(value) else math.nan  # type: ignore[arg-type]
    ok = (number > low if low_open else number >= low) and (
        number < high if high_open else number <= high
    )
    if not ok or (number in (_INF, -_INF) and not infinite):
        raise _fail(
            error,
            name,
            _constraint(
                low, high, low_open=low_open, high_open=high_open, infinite=infinite, unit=unit
            ),
            value,
        )
    return number


def _constraint(
    low: float, high: float, *, low_open: bool, high_open: bool, infinite: bool, unit: str
) -> str:
    bounded = low > -_INF and high < _INF
    what = ("a number" if infinite or bounded else "a finite number") + (
        f" of {unit}" if unit else ""
    )
    if low == -_INF and high == _INF:
        return what
    if high == _INF:
        bound = f"{'>' if low_open else '>='} {low:g}"
    elif low == -_INF:
        bound = f"{'<' if high_open else '<='} {high:g}"
    else:
        bound = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    return f"{what} {bound}" + (" (inf allowed)" if infinite else "")


def seconds(
    name: str,
    value: object,
    *,
    positive: bool = False,
    minimum: float = 0.0,
    infinite: bool = False,
    error: _Error = ConfigError,
) -> float:
    """A duration in seconds: ``>= minimum`` (``> 0`` with ``positive``), finite unless
    ``infinite``. The one spelling of "seconds >= 0" for every policy."""
    return number(
        name,
        value,
        minimum,
        low_open=positive and minimum == 0,
        infinite=infinite,
        unit="seconds",
        error=error,
    )


def share(
    name: str,
    value: object,
    *,
    zero: bool = True,
    one: bool = True,
    error: _Error = ConfigError,
) -> float:
    """A share of calls or capacity in ``[0, 1]`` (``(0, …`` without ``zero``, ``…, 1)``
    without ``one``)."""
    return number(name, value, 0.0, 1.0, low_open=not zero, high_open=not one, error=error)


def flag(name: str, value: object, *, error: _Error = ConfigError) -> bool:
    """``value`` if it is ``True`` or ``False`` (``0``, ``"no"`` and ``None`` are refused)."""
    if not isinstance(value, bool):
        raise _fail(error, name, "true or false", value)
    return value


def text(name: str, value: object, *, empty: bool = False, error: _Error = ConfigError) -> str:
    """``value`` if it is a string (non-empty unless ``empty``)."""
    if not isinstance(value, str) or not (empty or value):
        raise _fail(error, name, "a string" if empty else "a non-empty string", value)
    return value


def choice(name: str, value: T, options: Collection[T], *, error: _Error = ConfigError) -> T:
    """``value`` if it is one of ``options``."""
    if isinstance(value, bool) or value not in options:
        listed = ", ".join(repr(o) for o in options)
        raise _fail(error, name, f"one of {listed}", value)
    return value


def function(
    name: str, value: Callable[..., T], *, what: str = "callable", error: _Error = ConfigError
) -> Callable[..., T]:
    """``value`` if it is callable (a function, a class, an object with ``__call__``)."""
    if not callable(value):
        raise _fail(error, name, what, value)
    return value


def instance(name: str, value: object, kind: type[T] | tuple[type[T], ...], what: str) -> T:
    """``value`` if it is an instance of ``kind``; ``what`` names it (``"a Store"``)."""
    if not isinstance(value, kind):
        raise _fail(ConfigError, name, what, value)
    return value


def codec(name: str, value: object) -> Any:
    """``value`` if it can store results: ``dumps(value) -> bytes`` and ``loads(bytes)``."""
    if not (callable(getattr(value, "dumps", None)) and callable(getattr(value, "loads", None))):
        raise _fail(ConfigError, name, "a codec with dumps() and loads()", value)
    return value


def exception_types(
    name: str, value: object, *, error: _Error = ConfigError
) -> tuple[type[BaseException], ...]:
    """An exception type or a tuple of them, as a tuple (what ``isinstance`` takes)."""
    items: Any = value if isinstance(value, tuple) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise _fail(error, name, "an exception type or a tuple of them", value)
    return tuple(items)
