"""``python -m floodwall.gateway -c gateway.yaml [--workers N]``: run the gateway.

The same entry starts worker processes (``--worker N --rundir DIR --fds 5,6``, used by the
supervisor only).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from floodwall import __version__

    parser = argparse.ArgumentParser(
        prog="python -m floodwall.gateway",
        epilog="Exit status: 0 ok; 1 the gateway could not start or run; 2 usage error or "
        "invalid input (unreadable file, invalid or non-gateway configuration).",
    )
    parser.add_argument("--version", action="version", version=f"floodwall {__version__}")
    parser.add_argument("-c", "--config", help="gateway configuration file (YAML, JSON or TOML)")
    parser.add_argument("-w", "--workers", type=int, default=None, help="worker processes")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rundir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fds", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        from floodwall.gateway.supervisor import worker_main

        worker_main(args.worker, args.rundir, args.fds)
        return 0
    if not args.config:
        parser.error("-c/--config is required")
    from floodwall.gateway.cli import gateway

    try:
        gateway(args.config, args.workers or 0)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["main"]
