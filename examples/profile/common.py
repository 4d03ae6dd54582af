"""What the three services of the profile example share: how they are guarded and served.

Every service is a FastAPI app behind two ASGI layers, outermost first:

1. :class:`~floodwall.drill.agent.DrillAgent`: inert unless ``FLOODWALL_CHAOS=1`` (``run.py``
   sets it for the drill); then it records the calls the service served and takes the drill's
   faults, as floodwall's mock services do;
2. :class:`~floodwall.asgi.FloodwallMiddleware`: the service's inbound guard (rate limits,
   shedding, the caller's deadline), answering 429/503 before the app runs.

``python SERVICE.py --port-file F`` binds a free 127.0.0.1 port (no race: the socket is bound
before uvicorn starts), writes the port to ``F`` and serves until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import Any

import uvicorn

from floodwall.asgi import FloodwallMiddleware
from floodwall.drill.agent import DrillAgent

HOST = "127.0.0.1"


def guarded(app: Any, name: str, **guard: Any) -> DrillAgent:
    """``app`` behind its inbound guard (``guard``: FloodwallMiddleware's options) and the
    drill's agent; FastAPI's ``add_middleware`` is not used so the agent object is at hand
    (its ``on_event`` is a listener for the service's own registry)."""
    app.add_middleware(FloodwallMiddleware, **guard)
    return DrillAgent(app, name=name)


def serve(app: Any, description: str) -> None:
    """The command line of every service: bind, announce the port, serve."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    parser.add_argument("--port-file", type=Path, help="write the bound port here")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, args.port))
    port = sock.getsockname()[1]
    if args.port_file is not None:
        partial = args.port_file.with_suffix(".partial")
        partial.write_text(str(port), encoding="utf-8")
        partial.replace(args.port_file)  # the reader never sees half a number
    print(f"{description}: http://{HOST}:{port}", flush=True)
    config = uvicorn.Config(
        app, log_level=os.environ.get("LOG_LEVEL", "warning"), access_log=False, lifespan="on"
    )
    uvicorn.Server(config).run(sockets=[sock])
