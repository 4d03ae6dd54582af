"""httpx integration: ``ResilientTransport`` and ``AsyncResilientTransport`` (needs httpx).

See :mod:`floodwall.integrations.httpx` and ``docs/integrations.md``.
"""

from floodwall.integrations.httpx import AsyncResilientTransport, ResilientTransport

__all__ = ["AsyncResilientTransport", "ResilientTransport"]
