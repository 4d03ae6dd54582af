"""``manage.py floodwall_check``: validate ``settings.FLOODWALL`` and ``FLOODWALL_GUARD``.

Prints the source and each resource with its pipeline; an invalid configuration is printed
with its path (the setting or file, then the key) and the command exits with status 1.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from floodwall._core.errors import ConfigError
from floodwall.django.apps import build_from_settings


class Command(BaseCommand):  # type: ignore[misc] # django ships no type information
    help = "Validate the floodwall settings (FLOODWALL, FLOODWALL_GUARD) and list the resources."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            current = build_from_settings()
        except ConfigError as exc:
            raise CommandError(f"invalid: {exc}") from None
        try:
            names = current.registry.names()
            self.stdout.write(f"valid: {current.source}: {len(names)} resource(s)")
            for name in names:
                self.stdout.write(f"  {name}: {current.registry.get(name).describe()}")
            limits = ", ".join(
                f"{limit.limiter.name}" + (f" on {limit.route}" if limit.route else "")
                for limit in current.guard.limits
            )
            self.stdout.write(
                f"  inbound guard: limits [{limits}], shedder {current.guard.shedder}"
            )
        finally:
            current.registry.close()
