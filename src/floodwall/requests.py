"""requests integration: the ``ResilientAdapter`` transport adapter (needs requests).

See :mod:`floodwall.integrations.requests` and ``docs/integrations.md``.
"""

from floodwall.integrations.requests import ResilientAdapter

__all__ = ["ResilientAdapter"]
