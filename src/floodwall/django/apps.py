"""The ``floodwall.django`` app: reads the settings once per process, on first use."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from floodwall._core.errors import ConfigError
from floodwall.config import Registry, load, parse
from floodwall.integrations._inbound import GuardOptions, InboundGuard, RateLimit

__all__ = ["Built", "FloodwallConfig", "build_from_settings", "built"]

_GUARD_OPTIONS = frozenset(GuardOptions.__annotations__) - {"registry"}


@dataclass(frozen=True)
class Built:
    """What the settings build: the registry and the inbound guard."""

    registry: Registry
    guard: InboundGuard
    source: str


def _document(value: Any) -> tuple[Any, str]:
    if isinstance(value, str | Path):
        return load(value), str(value)
    if isinstance(value, Mapping):
        return parse(value, "settings.FLOODWALL"), "settings.FLOODWALL"
    raise ConfigError(
        f"settings.FLOODWALL must be a configuration mapping or a file path, got {value!r}"
    )


def _limit(item: Any, index: int) -> RateLimit:
    if isinstance(item, RateLimit):
        return item
    where = f"settings.FLOODWALL_GUARD.limits[{index}]"
    if isinstance(item, str):
        return RateLimit(item)
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: must be a RateLimit, a rate or a mapping, got {item!r}")
    try:
        return RateLimit(**item)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _guard_options(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"settings.FLOODWALL_GUARD must be a mapping, got {value!r}")
    unknown = sorted(set(value) - _GUARD_OPTIONS)
    if unknown:
        known = ", ".join(sorted(_GUARD_OPTIONS))
        raise ConfigError(f"settings.FLOODWALL_GUARD: unknown option(s) {unknown} (known: {known})")
    options = dict(value)
    if "limits" in options:
        options["limits"] = [_limit(item, i) for i, item in enumerate(options["limits"])]
    return options


def build_from_settings() -> Built:
    """Build the registry and the guard from the settings now (raises :class:`ConfigError`)."""
    document, source = _document(getattr(settings, "FLOODWALL", {}))
    registry = Registry(document)
    options = _guard_options(getattr(settings, "FLOODWALL_GUARD", None))
    try:
        guard = InboundGuard(registry=registry, **options)
    except ConfigError as exc:
        raise ConfigError(f"settings.FLOODWALL_GUARD: {exc}") from None
    return Built(registry, guard, source)


_lock = threading.Lock()
_built: Built | None = None


def built() -> Built:
    """The process's registry and guard, built on first use (``ImproperlyConfigured`` when the
    settings are invalid: the message names the setting or file and the path in it)."""
    global _built  # noqa: PLW0603 - one per process, like Django's own app registry
    if _built is None:
        with _lock:
            if _built is None:
                try:
                    _built = build_from_settings()
                except ConfigError as exc:
                    raise ImproperlyConfigured(f"floodwall: {exc}") from exc
    return _built


def _reset() -> None:
    """Forget what was built (Django's ``setting_changed`` signal: tests that override the
    settings get a guard of their own)."""
    global _built
    with _lock:
        old, _built = _built, None
    if old is not None:
        old.registry.close()


def check_config(**_: Any) -> list[checks.CheckMessage]:
    """Django system check ``floodwall.E001``: the settings build."""
    try:
        build_from_settings().registry.close()
    except ConfigError as exc:
        return [checks.Error(str(exc), hint="see manage.py floodwall_check", id="floodwall.E001")]
    return []


class FloodwallConfig(AppConfig):  # type: ignore[misc] # django ships no type information
    name = "floodwall.django"
    label = "floodwall"
    verbose_name = "floodwall"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        checks.register(check_config, "floodwall")

        def changed(setting: str = "", **_: Any) -> None:
            if setting in ("FLOODWALL", "FLOODWALL_GUARD"):
                _reset()

        setting_changed.connect(changed, weak=False, dispatch_uid="floodwall-settings")
