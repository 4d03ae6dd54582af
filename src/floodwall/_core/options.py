"""Options objects: what every policy's settings are, shared by code and configuration.

A policy's options are a frozen dataclass with the documented defaults (from
:mod:`floodwall._core.defaults`) whose ``CHECKS`` table maps each field to its check in
:mod:`floodwall._core.validate`; ``__post_init__`` runs the table (:func:`check_all`) and then
the checks that relate two fields. The configuration schema runs the same table on each field
(:func:`check_field`) and builds the same object, so a bad value gets one message whether it
came from code or from a file. A policy keeps its options in one attribute, ``options``, and
``reconfigure`` replaces that attribute in one assignment: a reader sees the old options or the
new ones, never a mix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Check", "Checks", "check_all", "check_field", "kwargs", "optional"]

Check = Callable[[str, Any], Any]
"""A field check: ``check(name, value)`` returns the value (normalised) or raises naming it."""
Checks = Mapping[str, Check]


def optional(check: Check) -> Check:
    """``check``, with ``None`` let through (an option that is off)."""

    def checked(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return checked


def check_all(options: Any, checks: Checks) -> None:
    """Run every field's check on a (frozen) options object, storing the normalised values."""
    for name, check in checks.items():
        object.__setattr__(options, name, check(name, getattr(options, name)))


def check_field(checks: Checks, name: str, value: Any) -> Any:
    """One field's check (for the configuration schema); fields without one pass."""
    check = checks.get(name)
    return value if check is None else check(name, value)


def kwargs(options: Any) -> dict[str, Any]:
    """The options' fields as keyword arguments (shallow: nested options objects stay)."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.init}
