"""How the supervisor talks to worker processes: a small HTTP API on a Unix socket each.

The socket lives in a directory only the gateway's user can enter (mode 0700), so the control
API needs no token of its own. :class:`RemoteWorker` is the supervisor's client;
:func:`control_app` is the worker's side. A worker in the supervisor's own process is a
:class:`LocalWorker` with the same methods.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from floodwall._core.errors import ConfigError
from floodwall.gateway.app import Gateway

__all__ = ["LocalWorker", "RemoteWorker", "control_app"]


class LocalWorker:
    """A worker running in this process."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def status(self) -> dict[str, Any]:
        return self.gateway.status()

    async def metrics(self) -> str:
        return self.gateway.metrics()

    async def reload(self, text: str, source: str) -> dict[str, Any]:
        return await self.gateway.reload(text, source)

    async def override(self, action: str, target: str, ttl: float | None, reason: str) -> None:
        self.gateway.override(action, target, ttl, reason)


READ_TIMEOUT = 5.0
"""Seconds a worker has to answer ``/status`` or ``/metrics``: past it the worker is reported
down (frozen or overloaded) rather than holding the admin API, dashboard and scrape."""
CHANGE_TIMEOUT = 10.0
"""Seconds a worker has to apply a reload or an override (it builds a whole configuration, in
milliseconds on an idle machine); one that takes longer is replaced by a worker started on the
new configuration (see the supervisor's ``reload``)."""


class RemoteWorker:
    """A worker process reached through its control socket."""

    def __init__(self, path: str, index: int) -> None:
        self.path = path
        self.index = index
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.path),
                timeout=aiohttp.ClientTimeout(total=CHANGE_TIMEOUT),
            )
        return self._session

    async def _call(self, method: str, path: str, payload: Any = None) -> Any:
        timeout = aiohttp.ClientTimeout(total=READ_TIMEOUT if method == "GET" else CHANGE_TIMEOUT)
        url = f"http://worker{path}"
        async with self._client().request(method, url, json=payload, timeout=timeout) as answer:
            if answer.status in {400, 422}:
                raise ConfigError((await answer.json())["error"])
            answer.raise_for_status()
            if answer.content_type == "application/json":
                return await answer.json()
            return await answer.text()

    async def status(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", "/status")
        return result

    async def metrics(self) -> str:
        return str(await self._call("GET", "/metrics"))

    async def reload(self, text: str, source: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", "/reload", {"text": text, "source": source}
        )
        return result

    async def override(self, action: str, target: str, ttl: float | None, reason: str) -> None:
        payload = {"action": action, "target": target, "ttl": ttl, "reason": reason}
        await self._call("POST", "/override", payload)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def control_app(gateway: Gateway) -> web.Application:
    """The worker's side of the control API."""

    async def status(request: web.Request) -> web.Response:
        return web.json_response(gateway.status())

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=gateway.metrics())

    async def reload(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            result = await gateway.reload(body["text"], body["source"])
        except ConfigError as exc:
            return web.json_response({"error": str(exc)}, status=422)
        return web.json_response(result)

    async def override(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            gateway.override(
                body["action"], body["target"], body.get("ttl"), body.get("reason", "")
            )
        except (ConfigError, KeyError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reload", reload)
    app.router.add_post("/override", override)
    return app
