"""``floodwall demo``: a dependency fails, the breaker opens, the fallback answers, it heals.

A real aiohttp server on a free loopback port plays the dependency through three phases
(healthy, down: it hangs past the caller's timeout, healthy again). Eight callers call it every
50 ms through ``Pipeline(Fallback, CircuitBreaker, Timeout)``; every quarter second a line says
how the calls were answered, and every state change of the breaker is printed with its reason.
At the end it reports how long the breaker took to notice, how many calls still reached the
dying dependency, and how long recovery took. Everything stays on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from floodwall import CircuitBreaker, Event, Fallback, Pipeline, Timeout, call_context

HEALTHY_FIRST = 1.5
DOWN_FOR = 3.0
HEALTHY_AFTER = 2.5
INTERVAL = 0.05
CALLERS = 8
REPORT_EVERY = 0.25

Say = Callable[[str], object]


@dataclass
class Tally:
    """What the callers saw."""

    outage: tuple[float, float]
    fresh: int = 0
    degraded: int = 0
    reached_while_down: int = 0
    calls_while_down: int = 0
    events: list[tuple[float, Event]] = field(default_factory=list)
    tick: dict[str, int] = field(default_factory=dict)
    """Answers by kind since the last report line."""


class Dependency:
    """The price service: a real HTTP server on loopback that can be switched to hang."""

    def __init__(self, tally: Tally) -> None:
        self.down = False
        self.tally = tally
        self.url = ""
        self._runner: Any = None

    async def start(self) -> None:
        from aiohttp import web

        async def price(request: web.Request) -> web.Response:
            if self.down:
                self.tally.reached_while_down += 1
                await asyncio.sleep(1.0)  # it hangs: worse than failing fast
            return web.json_response({"sku": "A-1", "price": 42})

        app = web.Application()
        app.router.add_get("/price", price)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/price"

    async def stop(self) -> None:
        await self._runner.cleanup()


def protection(on_event: Callable[[Event], None]) -> tuple[Pipeline, CircuitBreaker]:
    """The policies under demonstration (a short window so the story fits in seconds)."""
    breaker = CircuitBreaker(
        "prices",
        minimum_calls=5,
        failure_rate=0.5,
        window=2.0,
        buckets=4,
        open_duration=1.0,
        listeners=[on_event],
    )
    pipeline = Pipeline(
        Fallback(value={"sku": "A-1", "price": None, "stale": True}, name="cached-price"),
        breaker,
        Timeout(0.2, name="prices-timeout"),
    )
    return pipeline, breaker


async def caller(
    pipeline: Pipeline,
    get_price: Callable[[], Awaitable[dict[str, Any]]],
    dependency: Dependency,
    stop_at: float,
) -> None:
    """Call the dependency every INTERVAL through the pipeline, tallying each answer."""
    tally = dependency.tally
    while time.monotonic() < stop_at:
        async with call_context() as ctx:
            await pipeline.call_async(get_price)
        tally.calls_while_down += dependency.down
        if ctx.degraded:
            tally.degraded += 1
            key = f"fallback:{ctx.degraded_reason}"
        else:
            tally.fresh += 1
            key = "fresh"
        tally.tick[key] = tally.tick.get(key, 0) + 1
        await asyncio.sleep(INTERVAL)


async def narrate(
    say: Say, dependency: Dependency, breaker: CircuitBreaker, started: float, stop_at: float
) -> None:
    """Flip the dependency's phases on schedule and print a line every REPORT_EVERY."""
    tally = dependency.tally
    schedule = [(tally.outage[0], True), (tally.outage[1], False)]
    reached = 0
    while time.monotonic() < stop_at:
        await asyncio.sleep(REPORT_EVERY)
        elapsed = time.monotonic() - started
        while schedule and elapsed >= schedule[0][0]:
            dependency.down = schedule.pop(0)[1]
            state = "DOWN (hangs)" if dependency.down else "healthy again"
            say(f"[bold]{elapsed:5.2f}s  -- the dependency is {state} --[/]")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(tally.tick.items())) or "-"
        hits, reached = tally.reached_while_down - reached, tally.reached_while_down
        style = "green" if set(tally.tick) <= {"fresh"} else "yellow"
        extra = f"; reached the dependency: {hits}" if dependency.down else ""
        say(
            f"[{style}]{elapsed:5.2f}s  breaker={breaker.state.name:<9} answers: {counts}{extra}[/]"
        )
        tally.tick.clear()


async def run_demo(
    say: Say = print,
    healthy_first: float = HEALTHY_FIRST,
    down_for: float = DOWN_FOR,
    healthy_after: float = HEALTHY_AFTER,
) -> Tally:
    """Run the scripted outage and return the tally (``say`` prints one line)."""
    from aiohttp import ClientSession, ClientTimeout

    started = time.monotonic()
    tally = Tally(outage=(healthy_first, healthy_first + down_for))
    dependency = Dependency(tally)
    await dependency.start()

    def on_event(event: Event) -> None:
        tally.events.append((time.monotonic() - started, event))
        say(
            f"[bold magenta]{time.monotonic() - started:5.2f}s  breaker "
            f"{event.from_state} -> {event.to_state}: {event.reason}[/]"
        )

    pipeline, breaker = protection(on_event)
    say(f"dependency listening on {dependency.url}; {CALLERS} callers, each every {INTERVAL}s")
    say(f"protection: {pipeline}")
    stop_at = started + healthy_first + down_for + healthy_after
    async with ClientSession(timeout=ClientTimeout(total=5)) as session:

        async def get_price() -> dict[str, Any]:
            async with session.get(dependency.url) as response:
                response.raise_for_status()
                return dict(await response.json())

        await asyncio.gather(
            narrate(say, dependency, breaker, started, stop_at),
            *(caller(pipeline, get_price, dependency, stop_at) for _ in range(CALLERS)),
        )
    await dependency.stop()
    return tally


def summarize(tally: Tally) -> list[str]:
    """The figures a reader should take away."""
    opened = [t for t, e in tally.events if e.to_state == "OPEN"]
    closed = [t for t, e in tally.events if e.to_state == "CLOSED"]
    lines = [
        f"answers: {tally.fresh} fresh, {tally.degraded} from the fallback, 0 errors",
        f"calls while the dependency was down: {tally.calls_while_down}, of which "
        f"{tally.reached_while_down} reached it (the breaker kept the rest away)",
    ]
    began, healed = tally.outage
    if opened:
        lines.append(f"detected: breaker opened {opened[0] - began:.2f}s after the outage began")
    if closed:
        lines.append(f"recovered: breaker closed {closed[-1] - healed:.2f}s after the dependency")
    return lines


def _plain(text: str) -> None:
    print(re.sub(r"\[/?[a-z ]*\]", "", text))


def main() -> None:
    """Entry point of ``floodwall demo``."""
    say: Say = _plain
    try:
        from rich.console import Console

        say = Console(highlight=False).print
    except ImportError:  # pragma: no cover - the cli extra brings rich
        pass
    tally = asyncio.run(run_demo(say))
    say("[bold]-- summary --[/]")
    for line in summarize(tally):
        say(line)
