"""The ``floodwall gateway`` command (wired into :mod:`floodwall.cli`)."""

from __future__ import annotations

import sys

from floodwall._core.errors import ConfigError

__all__ = ["gateway"]


def gateway(config: str, workers: int) -> None:
    """Run the gateway configured in ``config`` until SIGTERM or Ctrl-C.

    ``workers`` > 0 overrides the file's ``workers``; 0 keeps it. An invalid file, or a missing
    admin token, is reported on stderr with its path in the file and exits with status 2.
    """
    from floodwall.gateway.supervisor import run

    try:
        run(config, workers if workers > 0 else None)
    except ConfigError as exc:
        print(f"floodwall gateway: invalid configuration:\n{exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as exc:
        print(f"floodwall gateway: cannot start: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
