"""The ``floodwall gateway`` command (wired into :mod:`floodwall.cli`).

A gateway file is the library's document plus the gateway's own sections (``listen``,
``upstreams``, ``routes``, ``admin``, …): a file with none of them is a library configuration,
and the command says so instead of complaining about whatever the gateway misses first.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from floodwall._core.errors import ConfigError

__all__ = ["gateway", "gateway_sections", "is_gateway_document"]

INVALID = 2
"""Exit status for invalid input (a file that is not a valid gateway configuration)."""
FAILED = 1
"""Exit status for a gateway that could not start or run (the port is taken, …)."""


@cache
def gateway_sections() -> frozenset[str]:
    """The top-level keys only a gateway file has (the library document's keys left out)."""
    from floodwall.config.schema import Document
    from floodwall.gateway.config import GatewayDocument

    return frozenset(GatewayDocument.model_fields) - frozenset(Document.model_fields)


def is_gateway_document(raw: Mapping[str, Any]) -> bool:
    """Whether ``raw`` (a parsed file) is shaped like a gateway file: it has a gateway section."""
    return not gateway_sections().isdisjoint(raw)


def gateway(config: str, workers: int) -> None:
    """Run the gateway configured in ``config`` until SIGTERM or Ctrl-C.

    ``workers`` > 0 overrides the file's ``workers``; 0 keeps it. A file that is not a gateway
    configuration, an invalid one or a missing admin token is reported on stderr (with its path
    in the file) and exits with status 2; a gateway that cannot start exits with status 1.
    """
    from floodwall.gateway.supervisor import run

    try:
        _require_gateway_shape(config)
        run(config, workers if workers > 0 else None)
    except ConfigError as exc:
        print(f"floodwall gateway: invalid configuration:\n{exc}", file=sys.stderr)
        raise SystemExit(INVALID) from None
    except OSError as exc:
        print(f"floodwall gateway: cannot start: {exc}", file=sys.stderr)
        raise SystemExit(FAILED) from None


def _require_gateway_shape(config: str) -> None:
    from floodwall.config.loader import loads

    try:
        text = Path(config).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{config}: cannot read the file: {exc.strerror}") from exc
    raw = loads(text, config)
    if not is_gateway_document(raw):
        sections = ", ".join(sorted(gateway_sections()))
        raise ConfigError(
            f"{config}: this is not a gateway configuration: it has none of the gateway's "
            f"sections ({sections}). A library configuration is checked with "
            f"`floodwall check-config {config}`."
        )
