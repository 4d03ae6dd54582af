"""The floodwall gateway: a resilient HTTP reverse proxy with per-route policies.

``floodwall gateway -c gateway.yaml`` runs it; see ``docs/gateway.md``. In code::

    from floodwall.gateway import Gateway, load_gateway

    document, text = load_gateway("gateway.yaml")
    gateway = Gateway(document, text=text)
    await gateway.start()          # serves on document.listen
    ...
    await gateway.stop()
"""

from floodwall.gateway.app import Gateway
from floodwall.gateway.config import (
    GatewayDocument,
    load_gateway,
    parse_gateway,
    parse_gateway_text,
)
from floodwall.gateway.fallbacks import DEGRADED_HEADER

__all__ = [
    "DEGRADED_HEADER",
    "Gateway",
    "GatewayDocument",
    "load_gateway",
    "parse_gateway",
    "parse_gateway_text",
]
