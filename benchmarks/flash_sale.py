"""The seeds' flash sale in the simulator: service A and its level 1/2/3 dependencies at 100×.

    .venv/bin/python benchmarks/flash_sale.py [--quick] [--plots docs/img]

Service A (the seeds' 3.6.1 example) depends on B, D, H, J (level 1: A is useless without
them), C, G (level 2) and E, F, I, K (level 3). Every request to A does 2 ms of its own work and
calls each dependency while holding one of A's 24 workers (log-normal times, mean 3 ms per
level-1 call, 6 ms per level-2 call, 4 ms per level-3 call): 42 ms of a worker per request
with everything on, 26 ms without level 3, 14 ms with level 1 only.

The dependencies are real :class:`floodwall.config.Registry` resources (levels from the
document, a ``null`` fallback for levels 2 and 3), called through ``resource.call`` at the start
of each request; A's capacity and queue are the simulator's :class:`~floodwall.sim.Server`
(FIFO, unbounded, no deadline propagation: the plain service of the story), its clients an
open loop with a 1 s timeout. Normal load is 10 requests/s; the sale ramps to 1 000/s (100×)
over 40 s, holds it for 120 s (the *peak* phase), and ramps back down.

* **without shedding** A saturates at ≈ 570 requests/s on the way up; its queue then grows
  without bound and every request times out, whatever the level;
* **with** :class:`floodwall.degrade.AutoShedder` reading A's worker utilisation every second
  (``shed_above=0.9`` for 2 s, ``restore_below=0.45`` for 30 s), level 3 goes at ≈ 60× and
  level 2 at ≈ 90×; level-1 calls keep succeeding, and the levels come back, 2 then 3, once
  the sale is over.

``--step`` also runs the harsher variant where the load jumps from 1× to 100× at once: the
controller needs a few seconds to shed both levels, and the backlog built meanwhile times out.

Deterministic: the same seed gives the same figures everywhere. The plot needs matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from floodwall.config import Registry
from floodwall.degrade import AutoShedder
from floodwall.sim import Constant, Guard, Job, OpenLoop, Phase, Recorder, Server, SimCPU
from floodwall.sim.engine import Simulation

OWN_WORK = 0.002
"""Seconds of A's own work per request."""
DEPENDENCIES: dict[str, tuple[int, float]] = {
    "B": (1, 0.003),
    "D": (1, 0.003),
    "H": (1, 0.003),
    "J": (1, 0.003),
    "C": (2, 0.006),
    "G": (2, 0.006),
    "E": (3, 0.004),
    "F": (3, 0.004),
    "I": (3, 0.004),
    "K": (3, 0.004),
}
"""Name: (level, mean seconds one call holds an A worker)."""
WORKERS = 24
NORMAL = 10.0
"""Requests per second on a normal day; the sale runs at 100×."""
TIMEOUT = 1.0
SIGMA = 0.5
"""Shape of the log-normal call times."""
SHED_ABOVE = 0.9
RESTORE_BELOW = 0.45
SHED_AFTER = 2.0
RESTORE_AFTER = 30.0
INTERVAL = 1.0
"""The controller's settings: shed when A's workers are 90 % busy for 2 s; restore a level when
they are below 45 % for 30 s. 0.45 < 0.9 × 14/26 (and < 0.9 × 26/42): restoring a level never
lands above the shedding threshold at the load that allowed it, so the controller does not flap."""


def document() -> dict[str, Any]:
    """A's dependencies as a configuration document."""
    resources: dict[str, Any] = {}
    for name, (level, _) in DEPENDENCIES.items():
        entry: dict[str, Any] = {"level": level}
        if level > 1:
            entry["fallback"] = {"value": None}
        resources[name] = entry
    return {"resources": resources}


def phases(*, step: bool = False, peak: float = 120.0, quick: bool = False) -> list[Phase]:
    """Normal load, the ramp (or a step) to 100×, the peak, the ramp down, normal again."""
    calm = 20.0 if quick else 30.0
    after = 70.0 if quick else 90.0
    ramp = [] if step else [Phase(4.0, NORMAL * x, f"ramp {x:g}x") for x in range(10, 100, 10)]
    down = [Phase(4.0, NORMAL * x, f"down {x:g}x") for x in (75, 50, 25)]
    return [
        Phase(calm, NORMAL, "normal"),
        *ramp,
        Phase(peak, NORMAL * 100, "peak"),
        *down,
        Phase(after, NORMAL, "after"),
    ]


@dataclass
class Tally:
    """Per-second counts, binned by the request's arrival: offered, and good answers that
    called each level's dependencies (level 1: every good answer)."""

    offered: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    good: dict[int, defaultdict[int, int]] = field(
        default_factory=lambda: {level: defaultdict(int) for level in (1, 2, 3)}
    )
    shed: dict[int, int] = field(default_factory=dict)
    """Second → number of levels shed (0, 1 or 2) at that second's tick."""

    def rate(self, level: int, start: float, end: float) -> float:
        """Share of the requests arriving in ``[start, end)`` whose level-``level`` calls
        succeeded and were delivered in time."""
        seconds = range(int(start), int(end))
        offered = sum(self.offered.get(s, 0) for s in seconds)
        good = sum(self.good[level].get(s, 0) for s in seconds)
        return good / offered if offered else math.nan

    def series(self, level: int, end: float) -> list[float]:
        return [
            self.good[level].get(s, 0) / self.offered[s] if self.offered.get(s) else math.nan
            for s in range(int(end))
        ]


class FlashSaleGuard(Guard):
    """A's request handler: at start, call each dependency through its registry resource
    (a shed level's resource answers its ``null`` fallback at no cost), and hold the worker
    for A's work plus the calls made."""

    def __init__(self, sim: Simulation, registry: Registry, tally: Tally) -> None:
        self.sim = sim
        self.tally = tally
        self.resources = [
            (registry.get(name), level, mean) for name, (level, mean) in DEPENDENCIES.items()
        ]
        self._called: dict[Job, tuple[bool, bool]] = {}

    def _call(self, mean: float) -> float:
        mu = math.log(mean) - SIGMA**2 / 2
        return self.sim.rng.lognormvariate(mu, SIGMA)

    def on_arrival(self, job: Job, now: float) -> bool:
        self.tally.offered[int(job.arrival)] += 1
        return True

    def on_start(self, job: Job, now: float) -> bool:
        work = OWN_WORK
        called = {2: True, 3: True}
        for resource, level, mean in self.resources:
            cost: float | None = resource.call(self._call, mean)
            if cost is None:  # the level is shed: the fallback answered
                called[level] = False
            else:
                work += cost
        job.work = work
        self._called[job] = (called[2], called[3])
        return True

    def on_finish(self, job: Job, now: float, delivered: bool) -> None:
        level2, level3 = self._called.pop(job, (False, False))
        if delivered:
            second = int(job.arrival)
            self.tally.good[1][second] += 1
            if level2:
                self.tally.good[2][second] += 1
            if level3:
                self.tally.good[3][second] += 1


@dataclass
class Run:
    """One simulated sale."""

    label: str
    tally: Tally
    phases: list[tuple[float, float, str]]
    duration: float
    shedder: AutoShedder | None
    transitions: list[tuple[float, str]]

    def window(self, name: str) -> tuple[float, float]:
        return next((s, e) for s, e, n in self.phases if n == name)

    def rates(self, name: str, skip: float = 0.0) -> dict[int, float]:
        start, end = self.window(name)
        return {level: self.tally.rate(level, start + skip, end) for level in (1, 2, 3)}


def simulate(
    shedding: bool, *, step: bool = False, peak: float = 120.0, quick: bool = False, seed: int = 3
) -> Run:
    """Run the sale with or without automatic shedding."""
    sim = Simulation(seed)
    registry = Registry(document(), clock=sim.clock, metrics=False)
    tally = Tally()
    recorder = Recorder()
    server = Server(sim, WORKERS, recorder, guard=FlashSaleGuard(sim, registry, tally))
    plan = phases(step=step, peak=peak, quick=quick)
    OpenLoop(sim, server, recorder, plan, Constant(0.0), timeout=TIMEOUT).start()
    shedder: AutoShedder | None = None
    transitions: list[tuple[float, str]] = []
    if shedding:
        shedder = AutoShedder(
            registry,
            SimCPU(server),
            shed_above=SHED_ABOVE,
            restore_below=RESTORE_BELOW,
            shed_after=SHED_AFTER,
            restore_after=RESTORE_AFTER,
            interval=INTERVAL,
            clock=sim.clock,
        )
        active = shedder

        def tick(_: object) -> None:
            step_taken = active.tick()
            tally.shed[int(sim.clock.now)] = int(active.state)
            if step_taken is not None:
                transitions.append((sim.clock.now, f"{step_taken.action} level {step_taken.level}"))
            sim.after(active.interval, tick)

        sim.at(active.interval, tick)
    bounds, start = [], 0.0
    for phase in plan:
        bounds.append((start, start + phase.duration, phase.name))
        start += phase.duration
    sim.run(start + TIMEOUT)
    label = (
        ("with" if shedding else "without") + " automatic shedding" + (" (step)" if step else "")
    )
    return Run(label, tally, bounds, start, shedder, transitions)


def report(runs: list[Run]) -> None:
    print(
        "| run | level-1 success, peak | level 2, peak | level 3, peak "
        "| level 1, peak after its first 10 s | level 1, whole sale |"
    )
    print("|---|---|---|---|---|---|")
    for run in runs:
        peak = run.rates("peak")
        settled = run.rates("peak", skip=10.0)[1]
        whole = run.tally.rate(1, run.window("normal")[1], run.window("after")[0])
        print(
            f"| {run.label} | **{peak[1]:.2%}** | {peak[2]:.2%} | {peak[3]:.2%} "
            f"| {settled:.2%} | {whole:.2%} |"
        )
    print()
    for run in runs:
        if run.transitions:
            moves = ", ".join(f"{what} at {at:.0f} s" for at, what in run.transitions)
            print(f"- {run.label}: {moves}")
    print()


def plot(runs: list[Run], path: Path) -> bool:
    """The success rate per level and second, and what was shed; False without matplotlib."""
    try:
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return False
    figure, axes = plt.subplots(len(runs), 1, figsize=(9, 3.0 * len(runs)), sharex=True)
    styles = {1: ("tab:green", "-", 2.0), 2: ("tab:orange", "--", 1.2), 3: ("tab:red", ":", 1.4)}
    for axis, run in zip(axes, runs, strict=True):
        seconds = list(range(int(run.duration)))
        for second, shed in sorted(run.tally.shed.items()):
            if shed:  # shade the seconds during which levels were shed
                shade = "mistyrose" if shed == 1 else "lightsalmon"
                axis.axvspan(second, second + 1, color=shade, lw=0, alpha=0.6)
        for level in (1, 2, 3):
            colour, style, width = styles[level]
            axis.plot(
                seconds,
                run.tally.series(level, run.duration),
                color=colour,
                ls=style,
                lw=width,
                label=f"level-{level} calls succeeding",
            )
        axis.set_ylim(-0.05, 1.1)
        axis.set_ylabel("share of requests")
        axis.set_title(f"Flash sale at 100×, {run.label}", fontsize=10)
        load_axis = axis.twinx()
        load = [run.tally.offered.get(s, 0) for s in seconds]
        load_axis.fill_between(seconds, 0, load, color="grey", alpha=0.18, lw=0)
        load_axis.set_ylim(0, NORMAL * 100 * 1.6)
        load_axis.set_ylabel("requests/s (grey)")
        handles, labels = axis.get_legend_handles_labels()
        if run.tally.shed:
            patch = importlib.import_module("matplotlib.patches").Patch
            handles += [patch(color="mistyrose"), patch(color="lightsalmon")]
            labels += ["level 3 shed", "levels 2 and 3 shed"]
        axis.legend(handles, labels, loc="center left", fontsize=7, framealpha=0.9)
    axes[-1].set_xlabel("seconds (normal, ramp to 100×, peak, ramp down, normal)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the seeds' flash sale, simulated")
    parser.add_argument("--quick", action="store_true", help="a 60 s peak instead of 120 s")
    parser.add_argument("--step", action="store_true", help="also run the 1× → 100× step")
    parser.add_argument("--plots", type=Path, default=Path("docs/img"))
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    peak = 60.0 if args.quick else 120.0
    started = time.perf_counter()
    runs = [
        simulate(False, peak=peak, quick=args.quick),
        simulate(True, peak=peak, quick=args.quick),
    ]
    if args.step:
        runs.append(simulate(True, step=True, peak=peak, quick=args.quick))
    report(runs)
    if not args.no_plots and plot(runs[:2], args.plots / "degradation-flash-sale.png"):
        print(f"plot: {args.plots / 'degradation-flash-sale.png'}")
    print(f"_simulated in {time.perf_counter() - started:.1f} s of wall time_")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
