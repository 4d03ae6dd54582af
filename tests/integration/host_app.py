"""The app the host-wide tests serve with gunicorn (``wsgi``) and uvicorn (``asgi``): each request
calls the dependency at ``DEP_URL`` through one HostBulkhead of ``host://$HOST_NAME``."""

from __future__ import annotations

import asyncio
import os
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

import floodwall as fw

BULKHEAD = fw.HostBulkhead(
    "dependency", store=f"host://{os.environ['HOST_NAME']}", max_concurrent=int(os.environ["SIZE"])
)


def _call_dependency() -> bytes:
    url, pid = os.environ["DEP_URL"], str(os.getpid())
    request = urllib.request.Request(url, headers={"X-Pid": pid})  # noqa: S310 - loopback http
    with urllib.request.urlopen(request, timeout=20) as answer:  # noqa: S310 - loopback http
        body: bytes = answer.read()
        return body


def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    try:
        body = BULKHEAD.call(_call_dependency)
    except fw.BulkheadFullError:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"full"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body]


async def _call_dependency_async() -> bytes:
    return await asyncio.to_thread(_call_dependency)


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    try:
        body, status = await BULKHEAD.call_async(_call_dependency_async), 200
    except fw.BulkheadFullError:
        body, status = b"full", 503
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})
