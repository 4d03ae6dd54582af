"""The admin API: its own listener (127.0.0.1 by default), a bearer token on every call.

==============================  ==================================================================
``GET /healthz``                 ``ok`` (no token: for orchestrators' liveness probes)
``GET /status``                  every route, upstream, endpoint, breaker, limiter, live (JSON)
``POST /breakers/NAME/open``     force the breaker of route or resource NAME open (``?ttl=30``)
``POST /breakers/NAME/closed``   force it closed
``POST /breakers/NAME/reset``    end the override, back to CLOSED
``POST /shed/LEVEL``             shed dependency level 2 or 3 (``?ttl=``); ``DELETE`` restores it
``POST /chaos/NAME``             turn on the ``chaos`` section of route or resource NAME (where
                                 chaos is allowed); ``DELETE`` turns it off
``POST /reload``                 apply the body (YAML/JSON), or re-read the file when empty;
                                 an invalid one is refused (422) and the running one kept
``GET /metrics``                 Prometheus text format
``GET /dashboard``               the live dashboard (a login form first, then a session cookie)
``GET /dashboard/events``        the dashboard's Server-Sent Events, one frame per second
==============================  ==================================================================

The token is read from the environment variable ``admin.token_env`` when the gateway starts;
without one (or one shorter than 16 characters) the gateway refuses to start rather than
expose an unauthenticated control plane. Tokens are compared in constant time. Changes are
made with ``POST``/``DELETE`` and the bearer header only: the dashboard's cookie opens the page
and its event stream, never a change (no cross-site request forgery). The dashboard cookie is
``HttpOnly`` and ``SameSite=Strict``.

The admin API speaks to every worker of the gateway through :class:`WorkerHandle` s; with
several workers, figures are merged and changes fanned out (:mod:`floodwall.gateway.supervisor`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from floodwall._core.errors import ConfigError
from floodwall.gateway._server import no_server_field
from floodwall.gateway.dashboard import asset, frame, merge_status
from floodwall.integrations._wire import PROBLEM_JSON, problem

__all__ = ["MIN_TOKEN_LENGTH", "Admin", "Control", "admin_token"]

MIN_TOKEN_LENGTH = 16
SESSION_COOKIE = "floodwall_session"
SESSION_TTL = 12 * 3600.0
_LOGIN = """<!doctype html><html><head><meta charset="utf-8"><title>floodwall admin</title>
<link rel="stylesheet" href="/dashboard/style.css"></head><body class="login">
<form method="post" action="/dashboard/login"><h1>floodwall gateway</h1>
<label>Admin token <input id="token" name="token" type="password" autofocus></label>
<button id="login" type="submit">Open the dashboard</button>{error}</form></body></html>"""


def admin_token(env_name: str, environ: dict[str, str]) -> str:
    """The admin token from ``environ[env_name]``; :class:`ConfigError` if missing or short."""
    token = environ.get(env_name, "")
    if len(token) < MIN_TOKEN_LENGTH:
        what = "is not set" if not token else f"is shorter than {MIN_TOKEN_LENGTH} characters"
        raise ConfigError(
            f"admin.token_env: the environment variable {env_name} {what}; the admin listener "
            "needs a bearer token (or set `admin: null` to run without the admin API)"
        )
    return token


class Control(Protocol):
    """What the admin API drives: the gateway's workers, seen as one."""

    async def status(self) -> dict[str, Any]: ...

    async def metrics(self) -> str: ...

    async def reload(self, text: str | None, source: str) -> dict[str, Any]: ...

    async def override(self, action: str, target: str, ttl: float | None, reason: str) -> None: ...


def _error(status: int, kind: str, detail: str) -> web.Response:
    return web.Response(
        status=status, body=problem(status, kind, detail), content_type=PROBLEM_JSON.split(";")[0]
    )


def _ttl(request: web.Request) -> float | None:
    raw = request.query.get("ttl")
    if raw is None:
        return None
    try:
        ttl = float(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"ttl must be seconds, got {raw!r}") from None
    if not 0 < ttl < float("inf"):
        raise web.HTTPBadRequest(text=f"ttl must be > 0 seconds, got {raw!r}")
    return ttl


class Admin:
    """The admin listener's application (see [Gateway][guide-gateway])."""

    def __init__(
        self,
        control: Control,
        token: str,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control = control
        self._token = token.encode()
        self.interval = interval
        self.clock = clock
        self._sessions: dict[str, float] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.app = self._build()

    # -- auth --------------------------------------------------------------------------------

    def _bearer_ok(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self._token
        )

    def _session_ok(self, request: web.Request) -> bool:
        session = request.cookies.get(SESSION_COOKIE)
        if not session:
            return False
        expires = self._sessions.get(session)
        if expires is None or expires < self.clock():
            self._sessions.pop(session, None)
            return False
        return True

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        path = request.path
        if path == "/healthz" or path in ("/dashboard", "/dashboard/login", "/dashboard/style.css"):
            return await handler(request)
        if self._bearer_ok(request):
            return await handler(request)
        if request.method == "GET" and path.startswith("/dashboard/") and self._session_ok(request):
            return await handler(request)
        response = _error(
            401, "unauthorized", "a valid 'Authorization: Bearer <token>' is required"
        )
        response.headers["WWW-Authenticate"] = 'Bearer realm="floodwall"'
        return response

    # -- routes --------------------------------------------------------------------------------

    def _build(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=8 * 1024 * 1024)
        app.on_response_prepare.append(no_server_field)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/status", self._status)
        app.router.add_post("/breakers/{name}/{action}", self._breaker)
        app.router.add_post("/shed/{level}", self._shed)
        app.router.add_delete("/shed/{level}", self._restore)
        app.router.add_post("/chaos/{name}", self._chaos_on)
        app.router.add_delete("/chaos/{name}", self._chaos_off)
        app.router.add_post("/reload", self._reload)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/dashboard", self._dashboard)
        app.router.add_post("/dashboard/login", self._login)
        app.router.add_get("/dashboard/events", self._events)
        app.router.add_get("/dashboard/{asset}", self._asset)
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(await self.control.status(), dumps=_dumps)

    async def _breaker(self, request: web.Request) -> web.Response:
        name, action = request.match_info["name"], request.match_info["action"]
        actions = {"open": "force_open", "closed": "force_closed", "reset": "clear"}
        if action not in actions:
            return _error(404, "unknown_action", f"use open, closed or reset, got {action!r}")
        return await self._override(actions[action], name, request)

    async def _shed(self, request: web.Request) -> web.Response:
        return await self._override("shed", request.match_info["level"], request)

    async def _restore(self, request: web.Request) -> web.Response:
        return await self._override("restore", request.match_info["level"], request)

    async def _chaos_on(self, request: web.Request) -> web.Response:
        return await self._override("chaos_on", request.match_info["name"], request)

    async def _chaos_off(self, request: web.Request) -> web.Response:
        return await self._override("chaos_off", request.match_info["name"], request)

    async def _override(self, action: str, target: str, request: web.Request) -> web.Response:
        reason = request.query.get("reason", f"{action} by admin API")
        try:
            await self.control.override(action, target, _ttl(request), reason)
        except (ConfigError, KeyError) as exc:
            return _error(400, "bad_override", str(exc).strip("'\""))
        return web.json_response({"ok": True, "action": action, "target": target})

    async def _reload(self, request: web.Request) -> web.Response:
        text = await request.text()
        source = request.query.get("source") or ("<admin>" if text.strip() else "")
        if request.content_type == "application/json" and text.strip():
            source = source if source.endswith(".json") else f"{source}.json"
        try:
            result = await self.control.reload(text if text.strip() else None, source)
        except ConfigError as exc:
            return _error(422, "config_rejected", f"the running configuration is kept: {exc}")
        return web.json_response(result)

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            text = await self.control.metrics()
        except ImportError as exc:  # prometheus_client is an optional dependency
            return _error(501, "metrics_unavailable", f"install prometheus_client: {exc}")
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    # -- dashboard -----------------------------------------------------------------------------

    async def _dashboard(self, request: web.Request) -> web.Response:
        if not (self._session_ok(request) or self._bearer_ok(request)):
            return web.Response(text=_LOGIN.format(error=""), content_type="text/html")
        body, content_type = asset("index.html")
        return web.Response(body=body, content_type=content_type.split(";")[0], charset="utf-8")

    async def _login(self, request: web.Request) -> web.Response:
        form = await request.post()
        given = str(form.get("token", "")).encode()
        if not hmac.compare_digest(given, self._token):
            await asyncio.sleep(0.2)  # slows guessing; the token's length does the rest
            page = _LOGIN.format(error='<p class="error">wrong token</p>')
            return web.Response(status=401, text=page, content_type="text/html")
        session = secrets.token_urlsafe(32)
        now = self.clock()
        self._sessions = {k: v for k, v in self._sessions.items() if v > now}
        self._sessions[session] = now + SESSION_TTL
        response = web.HTTPSeeOther("/dashboard")
        response.set_cookie(
            SESSION_COOKIE,
            session,
            httponly=True,
            samesite="Strict",
            path="/",
            max_age=int(SESSION_TTL),
        )
        raise response

    async def _asset(self, request: web.Request) -> web.Response:
        name = request.match_info["asset"]
        try:
            body, content_type = asset(name)
        except KeyError:
            raise web.HTTPNotFound() from None
        return web.Response(body=body, content_type=content_type.split(";")[0], charset="utf-8")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        before: dict[str, Any] | None = None
        last = self.clock()
        try:
            while True:
                now = self.clock()
                status = await self.control.status()
                data = frame(status, before, now - last, time.time())
                await response.write(f"data: {_dumps(data)}\n\n".encode())
                before, last = status, now
                await asyncio.sleep(self.interval)
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        self._runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", ())
        self.port = sockets[0].getsockname()[1] if sockets else port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


__all__ += ["merge_status"]
