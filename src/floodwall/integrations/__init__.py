"""Integrations where Python services live: httpx, aiohttp, requests, ASGI, WSGI and gRPC.

Each framework module is imported from one path only, at the top level (``floodwall.httpx``,
``floodwall.aiohttp``, ``floodwall.requests``, ``floodwall.asgi``, ``floodwall.wsgi``,
``floodwall.grpc``); each imports its framework itself, so ``import floodwall`` needs none of
them. This package holds the shared, framework-free parts: :mod:`._wire` (the one
header set), :mod:`._outbound` (routing and classification for every client) and
:mod:`._inbound` (the guard core every server shares). See ``docs/integrations.md``.
"""

from floodwall.integrations._wire import Hop, current_hop, current_priority, priority

__all__ = ["Hop", "current_hop", "current_priority", "priority"]
