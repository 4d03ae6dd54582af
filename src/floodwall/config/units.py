"""Human units in configuration: durations (``250ms``, ``5s``, ``2m``) and rates (``100/s``).

Numbers are taken as they are: seconds for durations, permits per second for rates. A rate is
read by the rate limiters' parser into their :class:`~floodwall.Rate`, so a rate means the same
in a config file as in code. Errors say what was expected and echo the value.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer, PlainValidator

from floodwall._core import validate
from floodwall.ratelimit._base import Rate as _Rate
from floodwall.ratelimit._base import parse_rate

__all__ = ["Duration", "Rate", "format_duration", "parse_duration", "parse_rate"]

_SECONDS = {
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zµ]+)\s*$")


def parse_duration(value: object) -> float:
    """Seconds from ``"250ms"``, ``"1.5s"``, ``"2m"``, ``"1h"``, ``"1d"`` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '250ms' or '5s', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value.lower())
        if match is None or match.group(2) not in _SECONDS:
            raise ValueError(
                f"expected a duration such as '250ms', '5s', '2m' (units: us, ms, s, m, h, d), "
                f"got {value!r}"
            )
        seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    else:
        raise ValueError(f"expected a duration such as '250ms' or '5s', got {value!r}")
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"a duration must be finite and >= 0, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest exact human form: ``0.25 -> '250ms'``, ``120 -> '2m'``."""
    validate.seconds("seconds", seconds, infinite=True, error=ValueError)
    if seconds == math.inf:
        return "inf"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 1e-3)):
        count = seconds / size
        if count >= 1 and abs(count - round(count)) < 1e-9:
            return f"{round(count)}{unit}"
    return f"{seconds:g}s"


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
"""A duration in seconds that accepts human units in configuration."""

Rate = Annotated[_Rate, PlainValidator(parse_rate), PlainSerializer(str, return_type=str)]
"""A :class:`~floodwall.Rate` that accepts ``"100/s"``-style strings in configuration."""


def _per_second(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, _Rate | str | int | float):
        raise ValueError(f"expected a rate such as '100/s' or '5/h', got {value!r}")
    return parse_rate(value).per_second


PerSecond = Annotated[float, BeforeValidator(_per_second)]
"""A load in events per second (a drill's arrivals), written in the same rate grammar; the
drill's schema type, not a public name."""
