"""``floodwall demo``: a dependency fails, the breaker opens, the fallback answers, it heals.

A real aiohttp server on a free loopback port plays the dependency through three phases
(healthy, down: it hangs past the caller's timeout, healthy again). Eight callers call it every
50 ms through ``Pipeline(Fallback, CircuitBreaker, Timeout)``; every quarter second a line says
how the calls were answered, and every state change of the breaker is printed with its reason. At the end it reports how long the
breaker took to notice, how many calls still reached the dying dependency, and how long recovery
took. Everything stays on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from floodwall import CircuitBreaker, Event, Fallback, Pipeline, Timeout, call_context

HEALTHY_FIRST = 1.5
DOWN_FOR = 3.0
HEALTHY_AFTER = 2.5
INTERVAL = 0.05
CALLERS = 8
REPORT_EVERY = 0.25


@dataclass
class Tally:
    """What the client saw, phase by phase."""

    fresh: int = 0
    degraded: int = 0
    reached_while_down: int = 0
    calls_while_down: int = 0
    outage: tuple[float, float] = (0.0, 0.0)
    events: list[tuple[float, Event]] = field(default_factory=list)


async def run_demo(
    say: Any = print,
    healthy_first: float = HEALTHY_FIRST,
    down_for: float = DOWN_FOR,
    healthy_after: float = HEALTHY_AFTER,
) -> Tally:
    """Run the scripted outage and return the tally (``say`` prints one line)."""
    from aiohttp import ClientSession, ClientTimeout, web

    started = time.monotonic()
    down = {"now": False}
    tally = Tally(outage=(healthy_first, healthy_first + down_for))

    async def price(request: web.Request) -> web.Response:
        if down["now"]:
            tally.reached_while_down += 1
            await asyncio.sleep(1.0)  # the dependency hangs: worse than failing fast
        return web.json_response({"sku": "A-1", "price": 42})

    app = web.Application()
    app.router.add_get("/price", price)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
    url = f"http://127.0.0.1:{port}/price"

    def on_event(event: Event) -> None:
        tally.events.append((time.monotonic() - started, event))
        say(
            f"[bold magenta]{time.monotonic() - started:5.2f}s  breaker "
            f"{event.from_state} -> {event.to_state}: {event.reason}[/]"
        )

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
    say(f"dependency listening on {url}; {CALLERS} callers, one call each per {INTERVAL}s")
    say(f"protection: {pipeline}")

    async with ClientSession(timeout=ClientTimeout(total=5)) as session:

        async def get_price() -> dict[str, Any]:
            async with session.get(url) as response:
                response.raise_for_status()
                return dict(await response.json())

        tick: dict[str, int] = {}

        async def caller(stop_at: float) -> None:
            while time.monotonic() < stop_at:
                async with call_context() as ctx:
                    await pipeline.call_async(get_price)
                if down["now"]:
                    tally.calls_while_down += 1
                if ctx.degraded:
                    tally.degraded += 1
                    key = f"fallback:{ctx.degraded_reason}"
                else:
                    tally.fresh += 1
                    key = "fresh"
                tick[key] = tick.get(key, 0) + 1
                await asyncio.sleep(INTERVAL)

        total = healthy_first + down_for + healthy_after
        stop_at = started + total
        callers = [asyncio.create_task(caller(stop_at)) for _ in range(CALLERS)]
        schedule = [(healthy_first, True), (healthy_first + down_for, False)]
        reached = 0
        while time.monotonic() < stop_at:
            await asyncio.sleep(REPORT_EVERY)
            elapsed = time.monotonic() - started
            while schedule and elapsed >= schedule[0][0]:
                down["now"] = schedule.pop(0)[1]
                state = "DOWN (hangs)" if down["now"] else "healthy again"
                say(f"[bold]{elapsed:5.2f}s  -- the dependency is {state} --[/]")
            counts = ", ".join(f"{k} {v}" for k, v in sorted(tick.items())) or "-"
            hits = tally.reached_while_down - reached
            reached = tally.reached_while_down
            style = "green" if set(tick) <= {"fresh"} else "yellow"
            say(
                f"[{style}]{elapsed:5.2f}s  breaker={breaker.state.name:<9} answers: {counts}"
                + (f"; reached the dependency: {hits}" if down["now"] else "")
                + "[/]"
            )
            tick.clear()
        await asyncio.gather(*callers)
    await runner.cleanup()
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


def main() -> None:
    """Entry point of ``floodwall demo``."""
    try:
        from rich.console import Console

        console = Console(highlight=False)
        say = console.print
    except ImportError:  # pragma: no cover - the cli extra brings rich
        import re

        def say(text: str) -> None:
            print(re.sub(r"\[/?[a-z ]*\]", "", text))

    tally = asyncio.run(run_demo(say))
    say("[bold]-- summary --[/]")
    for line in summarize(tally):
        say(line)
