"""Optional dependencies: the error that says which extra to install.

``import floodwall`` needs nothing beyond the standard library; each integration, adapter and the
configuration layer needs its own third-party library, brought by an extra. Importing one
without it raises :class:`ModuleNotFoundError` (so ``except ImportError`` still works, and
``.name`` is still the missing module) whose message names the extra::

    floodwall.httpx needs httpx, which is not installed: pip install 'floodwall[httpx]'
"""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra(error: ModuleNotFoundError, feature: str, extra: str) -> ModuleNotFoundError:
    """The error to raise (``from error``) when ``feature`` cannot import its dependency."""
    module = (error.name or "a dependency").partition(".")[0]
    return ModuleNotFoundError(
        f"{feature} needs {module}, which is not installed: pip install 'floodwall[{extra}]'",
        name=error.name,
    )
