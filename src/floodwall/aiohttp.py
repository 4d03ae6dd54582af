"""aiohttp integration: the ``ResilientMiddleware`` client middleware (needs aiohttp >= 3.12).

See :mod:`floodwall.integrations.aiohttp` and ``docs/integrations.md``.
"""

from floodwall.integrations.aiohttp import ResilientMiddleware

__all__ = ["ResilientMiddleware"]
