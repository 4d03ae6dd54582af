"""HTTP headers for a rate-limit decision: ``RateLimit-*`` and ``Retry-After``.

:func:`rate_limit_headers` turns a :class:`~floodwall.ratelimit.Decision` into the fields of the
IETF draft "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers, the
``RateLimit-Limit`` / ``RateLimit-Remaining`` / ``RateLimit-Reset`` form, with the optional
``RateLimit-Policy: LIMIT;w=WINDOW``) and, for a refusal, ``Retry-After`` (RFC 9110 §10.2.3).

Seconds are whole numbers rounded **up**: a client told to come back in ``ceil(x)`` seconds is
never early. ``Retry-After`` is left out when no wait will ever do (the request costs more than
the limit: answer 413 or 400 rather than 429).
"""

from __future__ import annotations

import math
from typing import Any

from floodwall.ratelimit._base import Decision, RateLimiter

__all__ = ["rate_limit_headers"]


def _whole(seconds: float) -> str:
    return str(max(0, math.ceil(seconds - 1e-9)))


def rate_limit_headers(
    decision: Decision, *, limiter: RateLimiter[Any] | None = None
) -> dict[str, str]:
    """The response headers for ``decision``; pass ``limiter`` to add ``RateLimit-Policy``.

    >>> headers = rate_limit_headers(Decision(False, 0, 2.5, 0.25, 10))
    >>> headers["RateLimit-Reset"], headers["Retry-After"]
    ('3', '1')
    """
    if not isinstance(decision, Decision):
        raise TypeError(f"decision must be a rate limiter's Decision, got {decision!r}")
    allowed, remaining, reset_after, retry_after, limit = decision
    headers = {
        "RateLimit-Limit": str(limit),
        "RateLimit-Remaining": str(max(0, remaining)),
        "RateLimit-Reset": _whole(reset_after),
    }
    if limiter is not None and limiter.window is not None:
        headers["RateLimit-Policy"] = f"{limit};w={_whole(limiter.window)}"
    if not allowed and retry_after != math.inf:
        headers["Retry-After"] = _whole(retry_after)
    return headers
