"""Mock dependencies: real aiohttp servers on 127.0.0.1 that behave as a scenario says.

A :class:`MockService` answers every path:

* **GET** (a read): after a delay drawn from its ``latency`` distribution, a JSON answer; a
  share ``error_rate`` answers ``error_status`` instead;
* **POST** (a write, JSON ``{"order": ..., "amount": ...}``): the write is applied to the
  service's **ledger**, a JSON-lines file with one line per applied write (``t``, ``order``,
  ``key``, ``request``), flushed at once. With ``idempotent: true`` a write carrying an
  ``Idempotency-Key`` runs through :class:`floodwall.Idempotency` (in-memory store): applied
  once per key, repeats get the stored answer (``Idempotent-Replayed: true``), a repeat while the
  first is still running gets 409;
* **capacity**: at most ``concurrency`` requests are served at once and ``queue`` more wait;
  any beyond get 503 at once;
* **faults** (:mod:`floodwall.drill.faults`) are floodwall chaos policies on the request path,
  built with ``allow=True`` and scheduled from the run's origin: before the work (latency, an
  error answer, a hang) or after a write was applied and before the answer (a hang "after
  apply": the response timed out but the money moved). A hung request carries on afterwards.

Every request is recorded with the edge request it serves (``X-Drill-Request``), for the
amplification figure. ``GET /_drill/health`` answers at once and is not recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from floodwall._core.errors import RejectedError
from floodwall.chaos import ChaosPolicy
from floodwall.context import idempotency_key
from floodwall.drill._record import Recorder
from floodwall.drill.metrics import Write
from floodwall.drill.scenario import ServiceSpec
from floodwall.pipeline import Pipeline
from floodwall.shared.idempotency import Idempotency, fingerprint_of

__all__ = ["HOST", "REQUEST_HEADER", "Ledger", "MockService", "read_ledger"]

HOST = "127.0.0.1"
REQUEST_HEADER = "X-Drill-Request"
"""The edge request a call serves (the load generator numbers them; edges pass it on)."""
CLIENT_GONE = 499
"""Status recorded for a call whose caller hung up before its request was read."""
SHUTDOWN_TIMEOUT = 0.5
"""Seconds a stopping server waits for handlers still running before cancelling them."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Ledger:
    """An append-only JSON-lines file of applied writes (flushed per line)."""

    def __init__(self, path: Path, service: str) -> None:
        self.path = path
        self.service = service
        self._file = path.open("a", encoding="utf-8")

    def apply(self, t: float, order: str, key: str | None, request: int | None) -> None:
        line = {"t": round(t, 6), "order": order, "key": key, "request": request}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_ledger(path: Path, service: str) -> list[Write]:
    """The writes a ledger file holds (missing file: none)."""
    if not path.exists():
        return []
    writes = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            writes.append(
                Write(service, float(item["t"]), str(item["order"]), item["key"], item["request"])
            )
    return writes


class MockService:
    """One mock dependency (see [Chaos drills][guide-drills]). ``start()`` binds a free port (or the
    spec's ``port``) on 127.0.0.1; ``stop()`` closes it and the ledger."""

    def __init__(
        self,
        name: str,
        spec: ServiceSpec,
        *,
        recorder: Recorder,
        ledger: Path,
        seed: int = 1,
    ) -> None:
        self.name = name
        self.spec = spec
        self.recorder = recorder
        self.ledger = Ledger(ledger, name)
        self.rng = random.Random(f"{seed}:{name}")
        self.before: Pipeline = Pipeline(name=f"{name}.faults")
        self.after: Pipeline = Pipeline(name=f"{name}.faults_after")
        self.idempotency = (
            Idempotency("memory://", fingerprint=fingerprint_of, name=name)
            if spec.idempotent
            else None
        )
        self.url = ""
        self.active = 0
        self.waiting = 0
        self.served = 0
        self._slots = asyncio.Semaphore(spec.capacity.concurrency) if spec.capacity else None
        self._charges = itertools.count(1)
        self._runner: web.AppRunner | None = None

    def add_faults(self, before: list[ChaosPolicy], after: list[ChaosPolicy]) -> None:
        """Put chaos policies on the request path (replacing the pipelines in one step each)."""
        self.before = Pipeline(*self.before.policies, *before, name=self.before.name)
        self.after = Pipeline(*self.after.policies, *after, name=self.after.name)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/_drill/health", _health)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, self.spec.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{HOST}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.ledger.close()

    # -- the request path -------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        index = self.recorder.call_started(self.name, _request_id(request))
        try:
            body = await request.read()  # the whole request first, as servers do
        except (ConnectionError, web.HTTPException):
            self.recorder.call_ended(index, CLIENT_GONE)
            raise
        response = await self._admitted(request, body)
        self.recorder.call_ended(index, response.status)
        return response

    async def _admitted(self, request: web.Request, body: bytes) -> web.StreamResponse:
        slots, capacity = self._slots, self.spec.capacity
        if slots is None or capacity is None:
            return await self._serve(request, body)
        if slots.locked() and self.waiting >= capacity.queue:
            return _json({"error": "overloaded", "service": self.name}, 503)
        self.waiting += 1
        try:
            await slots.acquire()
        finally:
            self.waiting -= 1
        try:
            return await self._serve(request, body)
        finally:
            slots.release()

    async def _serve(self, request: web.Request, body: bytes) -> web.StreamResponse:
        self.active += 1
        try:
            return await self.before.call_async(self._work, request, body)
        finally:
            self.active -= 1
            self.served += 1

    async def _work(self, request: web.Request, body: bytes) -> web.StreamResponse:
        await asyncio.sleep(self.spec.latency.sample(self.rng))
        if self.spec.error_rate and self.rng.random() < self.spec.error_rate:
            return _json({"error": "failed", "service": self.name}, self.spec.error_status)
        headers: dict[str, str] = {}
        if request.method == "POST":
            try:
                answer, replayed = await self._write(request, body)
            except RejectedError as exc:  # a repeat while the first is running: 409
                retry_after = f"{max(1, round(exc.retry_after or 1))}"
                return _json({"error": exc.kind}, 409, {"Retry-After": retry_after})
            if replayed:
                headers["Idempotent-Replayed"] = "true"
        else:
            answer = {"service": self.name, "value": f"{self.name}-data"}
        await self.after.call_async(_nothing)
        return _json(answer, 200, headers)

    async def _write(self, request: web.Request, raw: bytes) -> tuple[dict[str, Any], bool]:
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError):
            body = {}
        order = str(body.get("order", "")) if isinstance(body, dict) else ""
        amount = body.get("amount", 0) if isinstance(body, dict) else 0
        key = request.headers.get("Idempotency-Key") or None
        rid = _request_id(request)
        applied = False

        async def apply(order: str, amount: Any) -> dict[str, Any]:
            nonlocal applied
            applied = True
            self.ledger.apply(self.recorder.now(), order, key, rid)
            return {"charge": f"{self.name}-{next(self._charges)}", "order": order}

        if self.idempotency is None or key is None:
            return await apply(order, amount), False
        with idempotency_key(key):
            answer = await self.idempotency.call_async(apply, order, amount)
        return answer, not applied


async def _nothing() -> None:
    return None


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def _json(value: object, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(value, status=status, headers=headers)


def _request_id(request: web.Request) -> int | None:
    raw = request.headers.get(REQUEST_HEADER)
    if raw is None:
        return None
    with contextlib.suppress(ValueError):
        return int(raw)
    return None
