"""The posts service: a user's latest posts. Level 3 for the profile page: the page is still
worth showing without them. Guarded like users; the drill slows it down."""

from __future__ import annotations

from common import guarded, serve
from fastapi import FastAPI

from floodwall.adaptive import AdaptiveLimiter, Gradient2Limit, LoadShedder
from floodwall.asgi import RateLimit

app = FastAPI(title="posts")


@app.get("/health")
async def health() -> dict[str, bool]:
    return {"ok": True}


@app.get("/posts")
async def posts(user: int, limit: int = 3) -> list[dict[str, object]]:
    return [{"id": user * 100 + i, "user": user, "title": f"post {i}"} for i in range(limit)]


service = guarded(
    app,
    "posts",
    limits=[RateLimit("1000/s", route="/posts")],
    shedder=LoadShedder(AdaptiveLimiter(Gradient2Limit(initial_limit=100, max_concurrency=400))),
)

if __name__ == "__main__":
    serve(service, "posts")
