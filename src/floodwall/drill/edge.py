"""The edge under test: the service a drill's load hits, which calls the mock dependencies.

:class:`LocalEdge` is an aiohttp service on 127.0.0.1 modelled on the seeds' product-detail
service in a servlet container: a pool of ``workers`` (threads) and an accept ``queue``; a
request holds a worker from the moment it is taken off the queue until its answer is ready, and
when all workers are busy and the queue is full, new requests get 503 at once. Requests whose
caller gave up are still served when their turn comes (a container does not know either). Each
route calls its dependencies (in parallel, or one after the other) and answers 200 with their
answers once all of them answered.

How a dependency is called is what a drill compares:

* **protected**: the mode's floodwall config has a resource named after the dependency, and the
  call goes through ``registry.get(name).call_async(...)``, inside a
  :func:`~floodwall.call_context` (a fallback's answer marks the response ``X-Degraded``) and,
  for writes, an :func:`~floodwall.idempotency_key` set to the order id (sent as
  ``Idempotency-Key``);
* **unprotected**: no such resource: the edge's own ``client`` behaviour, ``timeout`` per
  attempt (none by default) and ``retries`` blind retries on any failure.

Every floodwall event of the registry goes to the run's recorder (the protective actions).
:class:`ExternalEdge` stands for an edge the drill does not run (your gateway): the load goes to
its ``url``, and its status endpoint, when given, is polled for breaker states.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from floodwall._core.errors import RejectedError
from floodwall.config.registry import Registry
from floodwall.config.schema import Document
from floodwall.context import call_context, current_idempotency_key, idempotency_key
from floodwall.drill._record import Recorder
from floodwall.drill.metrics import Action
from floodwall.drill.scenario import ClientSpec, EdgeSpec, RouteSpec, StatusSpec
from floodwall.drill.services import HOST, REQUEST_HEADER, SHUTDOWN_TIMEOUT
from floodwall.integrations._wire import DEGRADED

__all__ = ["DEGRADED_HEADER", "DependencyError", "ExternalEdge", "LocalEdge", "WorkerPool"]

DEGRADED_HEADER = DEGRADED
"""Names the dependencies a fallback answered for (the integrations' and gateway's header)."""


class PoolFullError(Exception):
    """Every worker is busy and the accept queue is full."""


class WorkerPool:
    """``workers`` concurrent handlers and a FIFO of at most ``queue`` waiting requests."""

    def __init__(self, workers: int, queue: int) -> None:
        self.workers = workers
        self.queue = queue
        self.busy = 0
        self.queued = 0
        self._slots = asyncio.Semaphore(workers)

    async def __aenter__(self) -> WorkerPool:
        if self._slots.locked() and self.queued >= self.queue:
            raise PoolFullError
        self.queued += 1
        try:
            await self._slots.acquire()
        finally:
            self.queued -= 1
        self.busy += 1
        return self

    async def __aexit__(self, *_: object) -> None:
        self.busy -= 1
        self._slots.release()


class DependencyError(Exception):
    """A dependency answered ``status`` (>= 400); ``status`` is what retry classification and
    breakers read, ``retry_after`` its ``Retry-After``."""

    def __init__(self, name: str, status: int, retry_after: str | None = None) -> None:
        super().__init__(f"{name} answered {status}")
        self.name = name
        self.status = status
        self.headers = {"Retry-After": retry_after} if retry_after else {}


def _status_of(exc: BaseException) -> int:
    """The edge's answer when a dependency call failed."""
    if isinstance(exc, TimeoutError):
        return 504
    if isinstance(exc, RejectedError):
        return 503
    return 502


class LocalEdge:
    """The edge service (see [Chaos drills][guide-drills]). ``start()`` returns its base URL."""

    def __init__(
        self,
        spec: EdgeSpec,
        *,
        urls: dict[str, str],
        document: Document | None,
        client: ClientSpec,
        recorder: Recorder,
    ) -> None:
        self.spec = spec
        self.urls = urls
        self.client = client
        self.recorder = recorder
        self.pool = WorkerPool(spec.workers, spec.queue)
        self.registry = (
            None if document is None else Registry(document, listeners=[recorder.on_event])
        )
        self.url = ""
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    def protection(self) -> dict[str, str]:
        """Each dependency's pipeline, as floodwall prints it (``unprotected`` without one)."""
        called = sorted({d for route in self.spec.routes for d in route.calls})
        out = {}
        for dependency in called:
            resource = self._resource(dependency)
            out[dependency] = str(resource.pipeline) if resource is not None else "unprotected"
        return out

    def _resource(self, dependency: str) -> Any:
        if self.registry is None or dependency not in self.registry.names():
            return None
        return self.registry.get(dependency)

    async def start(self) -> str:
        fanout = max(len(route.calls) for route in self.spec.routes)
        connector = aiohttp.TCPConnector(limit=self.spec.workers * fanout + 10)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application()
        for route in self.spec.routes:
            app.router.add_route(route.method, route.path, self._handler(route))
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0)
        await site.start()
        self.url = f"http://{HOST}:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def idle(self) -> bool:
        return self.pool.busy == 0 and self.pool.queued == 0

    # -- handling ---------------------------------------------------------------------------

    def _handler(self, route: RouteSpec) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            try:
                async with self.pool:
                    return await self._serve(route, request)
            except PoolFullError:
                return web.json_response({"error": "edge busy"}, status=503)

        return handle

    async def _serve(self, route: RouteSpec, request: web.Request) -> web.Response:
        rid = request.headers.get(REQUEST_HEADER, "")
        body: dict[str, Any] | None = None
        if route.write:
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                body = await request.json()
        calls = [self._call(d, route, rid, body) for d in route.calls]
        if route.fanout == "parallel":
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
        else:
            outcomes = []
            for call in calls:
                try:
                    outcomes.append(await call)
                except Exception as exc:  # noqa: BLE001 - answered as the route's failure
                    outcomes.append(exc)
                    for rest in calls[len(outcomes) :]:
                        rest.close()
                    break
        answer: dict[str, Any] = {}
        degraded: list[str] = []
        for dependency, outcome in zip(route.calls, outcomes, strict=False):
            if isinstance(outcome, BaseException):
                detail = {"error": str(outcome), "dependency": dependency}
                return web.json_response(detail, status=_status_of(outcome))
            value, was_degraded = outcome
            answer[dependency] = value
            if was_degraded:
                degraded.append(dependency)
        headers = {DEGRADED_HEADER: ",".join(degraded)} if degraded else None
        return web.json_response(answer, headers=headers)

    async def _call(
        self, dependency: str, route: RouteSpec, rid: str, body: dict[str, Any] | None
    ) -> tuple[Any, bool]:
        order = str(body.get("order")) if body and body.get("order") is not None else None
        resource = self._resource(dependency)
        if resource is None:
            return await self._naive(dependency, route, rid, body, order), False
        async with call_context() as context:
            if route.write and order is not None:
                with idempotency_key(order):
                    value = await resource.call_async(self._fetch, dependency, route, rid, body)
            else:
                value = await resource.call_async(self._fetch, dependency, route, rid, body)
        return value, context.degraded

    async def _naive(
        self,
        dependency: str,
        route: RouteSpec,
        rid: str,
        body: dict[str, Any] | None,
        order: str | None,
    ) -> Any:
        """The baseline client: a timeout per attempt (if any) and blind retries."""
        client = self.client
        last: BaseException | None = None
        for _ in range(1 + client.retries):
            try:
                async with asyncio.timeout(client.timeout):
                    if route.write and order is not None and client.idempotency_keys:
                        with idempotency_key(order):
                            return await self._fetch(dependency, route, rid, body)
                    return await self._fetch(dependency, route, rid, body)
            except Exception as exc:  # noqa: BLE001 - a blind client retries whatever failed
                last = exc
        assert last is not None
        raise last

    async def _fetch(
        self, dependency: str, route: RouteSpec, rid: str, body: dict[str, Any] | None
    ) -> Any:
        assert self._session is not None
        headers = {REQUEST_HEADER: rid}
        key = current_idempotency_key()
        if key is not None:
            headers["Idempotency-Key"] = key
        url = self.urls[dependency] + route.path
        async with self._session.request(
            route.method, url, json=body if route.write else None, headers=headers
        ) as response:
            text = await response.text()
            if response.status >= 400:
                retry_after = response.headers.get("Retry-After")
                raise DependencyError(dependency, response.status, retry_after)
            return json.loads(text) if text else None


class ExternalEdge:
    """An edge the drill does not run: the load goes to ``url``; breaker states come from the
    optional status endpoint, polled every ``interval`` (changes recorded as actions)."""

    def __init__(self, spec: EdgeSpec, recorder: Recorder) -> None:
        assert spec.url is not None
        self.url = spec.url.rstrip("/")
        self.status = spec.status
        self.recorder = recorder
        self.idle = True
        self.polls = 0
        self.poll_errors = 0
        self.last_error = ""
        self._task: asyncio.Task[None] | None = None

    def protection(self) -> dict[str, str]:
        return {}

    def notes(self) -> list[str]:
        """What went wrong while observing the edge (shown with the results)."""
        if not self.poll_errors:
            return []
        return [
            f"{self.poll_errors} of {self.polls} polls of {self.status.url if self.status else ''}"
            f" failed (last: {self.last_error}); breaker states may be missing"
        ]

    async def start(self) -> str:
        if self.status is not None:
            self._task = asyncio.create_task(self._poll(self.status))
        return self.url

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _poll(self, status: StatusSpec) -> None:
        headers = {}
        token = os.environ.get(status.token_env) if status.token_env else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        states: dict[str, str] = {}
        timeout = aiohttp.ClientTimeout(total=max(status.interval, 1.0))
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            while True:
                self.polls += 1
                try:
                    async with session.get(status.url) as response:
                        if response.status >= 400:
                            raise ValueError(f"HTTP {response.status}")
                        document = await response.json(content_type=None)
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    self.poll_errors += 1
                    self.last_error = str(exc) or type(exc).__name__
                    document = None
                if document is not None:
                    for name, state in breaker_states(document).items():
                        if states.get(name, "CLOSED") != state:
                            now = self.recorder.now()
                            self.recorder.action(Action(now, "state_change", "status", name, state))
                        states[name] = state
                await asyncio.sleep(status.interval)


def breaker_states(document: object) -> dict[str, str]:
    """``{resource: state}`` from a ``Registry.snapshot()``-shaped document (top level or under
    ``resources``)."""
    if isinstance(document, dict) and isinstance(document.get("resources"), dict):
        document = document["resources"]
    out: dict[str, str] = {}
    if isinstance(document, dict):
        for name, entry in document.items():
            breaker = entry.get("circuit_breaker") if isinstance(entry, dict) else None
            if isinstance(breaker, dict) and isinstance(breaker.get("state"), str):
                out[str(name)] = breaker["state"]
    return out
