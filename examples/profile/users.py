"""The users service: who a user is (name, avatar). Level 1: the profile page cannot do
without it. Guarded by a rate limit for all callers together and adaptive shedding."""

from __future__ import annotations

from common import guarded, serve
from fastapi import FastAPI

from floodwall.adaptive import AdaptiveLimiter, Gradient2Limit, LoadShedder
from floodwall.asgi import RateLimit

app = FastAPI(title="users")


@app.get("/health")
async def health() -> dict[str, bool]:
    return {"ok": True}


@app.get("/users/{user_id}")
async def user(user_id: int) -> dict[str, object]:
    return {"id": user_id, "name": f"user {user_id}", "avatar": f"/avatars/{user_id}.png"}


service = guarded(
    app,
    "users",
    limits=[RateLimit("1000/s", route="/users/*")],
    shedder=LoadShedder(AdaptiveLimiter(Gradient2Limit(initial_limit=100, max_concurrency=400))),
)

if __name__ == "__main__":
    serve(service, "users")
