"""Option checks shared by every policy: one wording for one mistake.

An option error names the option, the constraint and the value (STYLE.md #12), e.g.
``minimum_calls must be an integer >= 1, got 0``.
"""

from __future__ import annotations

from floodwall._core.errors import ConfigError

__all__ = ["count"]


def count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an integer (not a bool) of at least ``minimum``; else ``ConfigError``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value
