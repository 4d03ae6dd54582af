"""The drill's hook in a running service: :class:`DrillAgent`, an ASGI middleware.

A drill against your own services (``services: {users: {url: http://127.0.0.1:8101}}``) needs
from each of them what a mock service gives for free: the calls it served, each with the edge
request it served (``X-Drill-Request``, for the amplification figure), the protective actions
its floodwall policies took (for detection), and faults on its request path. Wrap the app::

    agent = DrillAgent(app, name="users")
    registry = Registry(document, listeners=[agent.on_event])   # its policies' actions too

**Off unless allowed**, like every chaos policy: ``allow=True``, or ``FLOODWALL_CHAOS=1`` when
``allow`` is left at ``None``. Otherwise every request goes straight to the app, nothing is
recorded, and ``/_drill/*`` is the app's own business. When allowed (bind the service to
loopback or a private network for the drill), the agent answers:

* ``GET /_drill/health``: ``{"service": NAME, "in_flight": N}``;
* ``POST /_drill/start`` with ``{"seed": 1, "faults": [{"index": i, "spec": FAULT}, ...]}``
  (each ``FAULT`` as :func:`~floodwall.drill.faults.fault_wire` writes it): t = 0 is now; the
  log starts empty and the faults replace any earlier ones, scheduled from t = 0, built by
  :func:`~floodwall.drill.faults.service_faults` exactly as on a mock service;
* ``GET /_drill/log``: ``{"calls": [[start, end, status, request], ...], "actions": [[time,
  kind, source, name, to_state, reason], ...]}`` in seconds since t = 0 (``end`` ``null`` for a
  call still running);
* ``POST /_drill/stop``: drops the faults and the log.

Outermost is the place for it: it then sees every call that reached the service (those the
service's own guard refused too), and its faults slow or fail the whole service. A hang "after
apply" holds the answer back after the app has done its work.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from floodwall._core.events import Event
from floodwall.chaos import ChaosPolicy, chaos_allowed
from floodwall.drill._record import Recorder
from floodwall.drill.faults import service_faults
from floodwall.drill.scenario import FaultSpec
from floodwall.drill.services import REQUEST_HEADER
from floodwall.pipeline import Pipeline

__all__ = ["PREFIX", "DrillAgent"]

PREFIX = "/_drill"
"""Paths the agent answers itself (when allowed)."""
MAX_BODY = 1 << 20
"""Largest control request read, bytes."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_HEADER = REQUEST_HEADER.lower().encode("latin-1")


@dataclass(frozen=True, slots=True)
class _Injected:
    """An ``error`` fault's answer, sent instead of calling the app."""

    status: int
    body: dict[str, Any]


async def _json(send: Send, status: int, value: object) -> None:
    body = json.dumps(value, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise ValueError(f"a control request may hold {MAX_BODY} bytes at most")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _request_id(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == _HEADER:
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _nothing() -> None:
    return None


def _faults(raw: object, origin: float) -> tuple[list[ChaosPolicy], list[ChaosPolicy]]:
    """The chaos policies of a ``start`` request's body (``ValueError`` when malformed)."""
    if not isinstance(raw, dict):
        raise ValueError("expected a JSON object {seed, faults}")
    seed, items = raw.get("seed", 1), raw.get("faults", [])
    if not isinstance(seed, int) or not isinstance(items, list):
        raise ValueError("seed must be an integer and faults a list")
    before: list[ChaosPolicy] = []
    after: list[ChaosPolicy] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("index"), int):
            raise ValueError(f"each fault must be {{index, spec}}, got {item!r}")
        try:
            fault = FaultSpec.model_validate(item.get("spec"))
        except ValidationError as exc:
            raise ValueError(f"fault {item['index']}: {exc}") from None
        if fault.service is None:
            raise ValueError(f"fault {item['index']}: a service fault names its service")
        add_before, add_after = service_faults(
            fault, item["index"], origin=origin, seed=seed, answer=_Injected
        )
        before += add_before
        after += add_after
    return before, after


class DrillAgent:
    """The drill's agent in front of an ASGI app (see [Chaos drills][guide-drills])."""

    def __init__(self, app: ASGIApp, *, name: str, allow: bool | None = None) -> None:
        self.app = app
        self.name = name
        self.allowed = chaos_allowed() if allow is None else allow
        self.recorder: Recorder | None = None
        """The current drill's log (``None``: no drill running, nothing recorded)."""
        self.before: Pipeline = Pipeline(name=f"{name}.faults")
        self.after: Pipeline = Pipeline(name=f"{name}.faults_after")

    def on_event(self, event: Event) -> None:
        """A floodwall listener: the service's policies report their actions here."""
        recorder = self.recorder
        if recorder is not None:
            recorder.on_event(event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.allowed:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path == PREFIX or path.startswith(PREFIX + "/"):
            await self._control(scope, receive, send)
            return
        recorder = self.recorder
        if recorder is None:
            await self.app(scope, receive, send)
            return
        await self._observed(recorder, scope, receive, send)

    async def _observed(
        self, recorder: Recorder, scope: Scope, receive: Receive, send: Send
    ) -> None:
        index = recorder.call_started(self.name, _request_id(scope))
        status = 500  # what the call counts as if the app fails before answering
        after = self.after

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                await after.call_async(_nothing)  # the work is done; the answer waits
            await send(message)

        async def serve() -> _Injected | None:  # an error fault answers in its place
            await self.app(scope, receive, sending)
            return None

        try:
            result = await self.before.call_async(serve)
            if result is not None:
                status = result.status
                await _json(send, result.status, result.body)
        finally:
            recorder.call_ended(index, status)

    async def _control(self, scope: Scope, receive: Receive, send: Send) -> None:
        what = (scope["method"], scope["path"][len(PREFIX) :])
        if what == ("GET", "/health"):
            in_flight = 0 if self.recorder is None else self.recorder.in_flight_calls
            await _json(send, 200, {"service": self.name, "in_flight": in_flight})
        elif what == ("POST", "/start"):
            await self._start(receive, send)
        elif what == ("GET", "/log"):
            await _json(send, 200, self.log())
        elif what == ("POST", "/stop"):
            self.recorder = None
            self.before = Pipeline(name=self.before.name)
            self.after = Pipeline(name=self.after.name)
            await _json(send, 200, {"stopped": True})
        else:
            await _json(send, 404, {"error": f"no drill call {what[0]} {scope['path']}"})

    async def _start(self, receive: Receive, send: Send) -> None:
        recorder = Recorder()
        try:
            raw = json.loads(await _body(receive) or b"{}")
            before, after = _faults(raw, recorder.origin)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            await _json(send, 422, {"error": str(exc)})
            return
        self.before = Pipeline(*before, name=self.before.name)
        self.after = Pipeline(*after, name=self.after.name)
        self.recorder = recorder
        await _json(send, 200, {"service": self.name, "faults": len(before) + len(after)})

    def log(self) -> dict[str, Any]:
        """The current drill's calls and actions (see [Chaos drills][guide-drills])."""
        recorder = self.recorder
        if recorder is None:
            return {"service": self.name, "calls": [], "actions": []}
        return {
            "service": self.name,
            "calls": [[c.start, c.end, c.status, c.request] for c in recorder.calls()],
            "actions": [
                [a.time, a.kind, a.source, a.name, a.to_state, a.reason] for a in recorder.actions
            ],
        }
