"""The profile service: renders a user's home page from two other services.

``GET /profile/{id}`` calls ``users`` (level 1: no page without it) and ``posts`` (level 3: the
page shows without them) in parallel; ``GET /profile/{id}/card`` needs ``users`` only. Both
calls go through floodwall's httpx transport, with the policies of ``profile.floodwall.yaml``
(timeouts, breakers, a retry budget, a fallback for posts). Calls to users also take a permit
of a global rate limit kept in Redis: the quota the users team gave every profile replica
together. A page whose posts came from the fallback says so: ``X-Degraded: posts``.

Configured by the environment: ``USERS_URL``, ``POSTS_URL``, ``REDIS_URL`` (the global limit's
store; default: in this process only), ``PROFILE_CONFIG`` (default: ``profile.floodwall.yaml``
beside this file).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from common import guarded, serve
from fastapi import FastAPI, HTTPException, Request, Response

from floodwall import RateLimitedError
from floodwall.asgi import RateLimit
from floodwall.config import Registry, load
from floodwall.drill.services import REQUEST_HEADER
from floodwall.httpx import AsyncResilientTransport

HERE = Path(__file__).resolve().parent
USERS = os.environ.get("USERS_URL", "http://127.0.0.1:8102").rstrip("/")
POSTS = os.environ.get("POSTS_URL", "http://127.0.0.1:8103").rstrip("/")


def registry_for(listeners: list[Any]) -> Registry:
    """The outbound policies of ``$PROFILE_CONFIG``, their ``shared`` store at ``$REDIS_URL``
    (where the global quota on users is counted)."""
    path = Path(os.environ.get("PROFILE_CONFIG", HERE / "profile.floodwall.yaml"))
    document = load(path)
    document.stores["shared"] = os.environ.get("REDIS_URL", "memory://")
    return Registry(document, listeners=listeners)


def host_port(url: str) -> str:
    parsed = httpx.URL(url)
    return f"{parsed.host}:{parsed.port}"


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    registry = registry_for([service.on_event])
    routes = {host_port(USERS): "users", host_port(POSTS): "posts"}
    transport = AsyncResilientTransport(registry=registry, routes=routes)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
    async with httpx.AsyncClient(transport=transport, limits=limits, timeout=5.0) as client:
        app.state.client = client
        try:
            yield
        finally:
            registry.close()


app = FastAPI(title="profile", lifespan=lifespan)


def forwarded(request: Request) -> dict[str, str]:
    """Headers passed on to the dependencies: the drill's request id, so each call is counted
    against the page request it served."""
    value = request.headers.get(REQUEST_HEADER)
    return {REQUEST_HEADER: value} if value else {}


async def fetch_user(request: Request, user_id: int) -> Any:
    """The user, or the HTTP error the page answers without one (level 1: no page)."""
    client: httpx.AsyncClient = request.app.state.client
    try:
        answer = await client.get(f"{USERS}/users/{user_id}", headers=forwarded(request))
    except RateLimitedError as exc:  # the fleet's quota on users (rate_limit, scope: global)
        retry_after = {"Retry-After": str(max(1, round(exc.retry_after or 1)))}
        raise HTTPException(503, "users quota used up", headers=retry_after) from exc
    except Exception as exc:  # an open breaker, a timeout, a refused connection
        raise HTTPException(503, f"users unavailable: {exc}") from exc
    if answer.status_code != 200:
        raise HTTPException(502, f"users answered {answer.status_code}")
    return answer.json()


@app.get("/health")
async def health() -> dict[str, bool]:
    return {"ok": True}


@app.get("/profile/{user_id}")
async def page(user_id: int, request: Request, response: Response) -> dict[str, Any]:
    client: httpx.AsyncClient = request.app.state.client
    user, posts = await asyncio.gather(
        fetch_user(request, user_id),
        client.get(f"{POSTS}/posts", params={"user": user_id}, headers=forwarded(request)),
    )
    if posts.status_code != 200:  # the fallback answers failures; this is a 4xx
        raise HTTPException(502, f"posts answered {posts.status_code}")
    if posts.headers.get("X-Degraded"):
        response.headers["X-Degraded"] = "posts"
    return {"user": user, "posts": posts.json()}


@app.get("/profile/{user_id}/card")
async def card(user_id: int, request: Request) -> dict[str, Any]:
    user = await fetch_user(request, user_id)
    return {"user": user}


service = guarded(app, "profile", limits=[RateLimit("2000/s")], deadline=2.0)

if __name__ == "__main__":
    serve(service, "profile")
