"""Simulator reproductions for docs/overload.md: tables on stdout, plots in docs/img/.

    .venv/bin/python benchmarks/overload_sim.py [--quick] [--plots docs/img]

1. concurrency-limits' gRPC example (capacity ≈ 100 rps; 0.5×, 0.9×, 2×, 1×, 100 s each) with
   every guard floodwall ships and without one;
2. DAGOR's fan-out experiment: success rate vs feed rate 1–4× for fan-out 1–4, coherent
   priorities vs random shedding;
3. the seeds' payment post-mortem: busy workers with and without protection.

Deterministic: the same seeds give the same numbers on every machine. Plots need matplotlib
(the ``bench`` extra); without it the tables are still printed.
"""

from __future__ import annotations

import argparse
import importlib
import math
import time
from pathlib import Path
from typing import Any

from floodwall.sim import SimResult, run_scenario
from floodwall.sim.library import GRADIENT2, fan_out, grpc_example, payment

CAPACITY = 100.0

GUARDS: list[tuple[str, dict[str, Any] | None]] = [
    ("none", None),
    ("Gradient2 (windowed, defaults)", GRADIENT2),
    ("Gradient (windowed)", {"type": "limiter", "algorithm": "gradient"}),
    ("Vegas (windowed)", {"type": "limiter", "algorithm": "vegas"}),
    (
        "AIMD (timeout 250 ms)",
        {"type": "limiter", "algorithm": "aimd", "options": {"timeout": 0.25}, "windowed": False},
    ),
    ("BBR (CPU = worker utilisation)", {"type": "bbr"}),
    ("DAGOR queueing time", {"type": "dagor"}),
    (
        "LoadShedder max_queue_time 100 ms",
        {"type": "shedder", "max_queue_time": 0.1, "at": "start"},
    ),
]


def _pyplot() -> Any:
    try:
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        return importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return None


def grpc(phase: float, plots: Path | None) -> None:
    print("## 1. concurrency-limits gRPC example (capacity ≈ 100 rps, client timeout 1 s)\n")
    print("| guard | goodput 0.5× | 0.9× | **2×** | 1× | p99 0.5× ms | **p99 2× ms** | p99 ratio |")
    print("|---|---|---|---|---|---|---|---|")
    runs: dict[str, SimResult] = {}
    for label, guard in GUARDS:
        result = run_scenario(grpc_example(guard, phase=phase))
        runs[label] = result
        phases = dict(result.summaries())
        unloaded, overloaded = phases["0.5x"], phases["2x"]
        ratio = overloaded.p99 / unloaded.p99 if not math.isnan(overloaded.p99) else math.nan
        print(
            f"| {label} | {unloaded.goodput:.1f} | {phases['0.9x'].goodput:.1f} | "
            f"**{overloaded.goodput:.1f}** | {phases['1x'].goodput:.1f} | "
            f"{unloaded.p99 * 1000:.0f} | **{overloaded.p99 * 1000:.0f}** | {ratio:.2f} |"
        )
    print()
    plt = _pyplot()
    if plots is None or plt is None:
        return
    figure, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for axis, label in zip(axes, ("none", "Gradient2 (windowed, defaults)"), strict=True):
        result = runs[label]
        end = result.duration
        seconds = range(int(end))
        axis.plot(seconds, result.recorder.series("offered", end), label="offered rps", lw=0.8)
        axis.plot(seconds, result.recorder.series("ok", end), label="goodput rps", lw=1.2)
        if label != "none":
            axis.plot(seconds, result.recorder.series("limit", end), label="limit", lw=1.2)
        axis.axhline(CAPACITY, color="grey", ls=":", lw=0.8)
        axis.set_title(f"gRPC example, guard: {label}")
        axis.set_ylabel("per second / limit")
        axis.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("seconds (phases 0.5×, 0.9×, 2×, 1× capacity)")
    figure.tight_layout()
    figure.savefig(plots / "overload-grpc.png", dpi=110)
    plt.close(figure)


def dagor(duration: float, warmup: float, plots: Path | None) -> None:
    print("## 2. DAGOR fan-out: success rate vs feed rate (optimum min(1, 1/x))\n")
    print(
        f"Each run starts at the step (an idle service meets the feed at once); **from the step**"
        f" counts the whole {duration:g} s, **steady** skips the first {warmup:g} s.\n"
    )
    feeds = (1.0, 2.0, 3.0, 4.0)
    print("| priorities | fan-out | measured | " + " | ".join(f"{f:g}×" for f in feeds) + " |")
    print("|---|---|---|" + "---|" * len(feeds))
    print("| optimum | – | – | " + " | ".join(f"{min(1, 1 / f):.3f}" for f in feeds) + " |")
    curves: dict[tuple[bool, int], list[float]] = {}
    for coherent in (True, False):
        for k in (1, 2, 3, 4):
            rates, from_step = [], []
            for feed in feeds:
                spec = fan_out(feed, k, coherent=coherent, duration=duration, warmup=warmup)
                result = run_scenario(spec)
                ((_, summary),) = result.summaries()
                ((_, whole),) = result.summaries(warmup=0.0)
                rates.append(summary.success_rate)
                from_step.append(whole.success_rate)
            curves[coherent, k] = rates
            name = "DAGOR (B, U) coherent" if coherent else "random per sub-call"
            for label, values in (("from the step", from_step), ("steady", rates)):
                print(
                    f"| {name} | {k} | {label} | " + " | ".join(f"{r:.3f}" for r in values) + " |"
                )
    print()
    plt = _pyplot()
    if plots is None or plt is None:
        return
    figure, axis = plt.subplots(figsize=(7, 4.5))
    fine = [1 + i / 20 for i in range(61)]
    axis.plot(fine, [min(1, 1 / f) for f in fine], color="black", lw=1, label="optimum 1/x")
    for (coherent, k), rates in curves.items():
        style = "-o" if coherent else "--x"
        prefix = "DAGOR" if coherent else "random"
        axis.plot(feeds, rates, style, ms=4, lw=1, label=f"{prefix}, fan-out {k}")
    axis.set_xlabel("feed rate (× capacity)")
    axis.set_ylabel("request success rate")
    axis.set_title("Fan-out under overload: coherent priorities vs random shedding")
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(plots / "overload-dagor.png", dpi=110)
    plt.close(figure)


def payments(duration: float, plots: Path | None) -> None:
    print("## 3. Payment post-mortem: 2 000 users, 5 % of payment calls hang 8 s, 200 workers\n")
    print(
        "| setup | goodput rps | success | p99 s | max busy workers | seconds pool exhausted "
        "| first exhausted at s |"
    )
    print("|---|---|---|---|---|---|---|")
    setups = [
        ("unprotected", payment(False, duration=duration)),
        ("timeout 1 s + bulkhead 100 + AIMD limit", payment(True, duration=duration)),
        (
            "timeout + bulkhead + Gradient2 limit",
            payment(
                True,
                duration=duration,
                guard={**GRADIENT2, "options": {"max_concurrency": 180}},
            ),
        ),
    ]
    series = {}
    for label, spec in setups:
        result = run_scenario(spec)
        overall = result.overall()
        busy = result.recorder.series("busy", duration)
        series[label] = busy
        full = [second for second, value in enumerate(busy) if value >= 200]
        first = str(full[0]) if full else "never"
        print(
            f"| {label} | {overall.goodput:.0f} | {overall.success_rate:.1%} | "
            f"{overall.p99:.2f} | {int(max(busy))} | {len(full)} | {first} |"
        )
    print()
    plt = _pyplot()
    if plots is None or plt is None:
        return
    figure, axis = plt.subplots(figsize=(8, 3.8))
    for label, busy in series.items():
        axis.plot(range(len(busy)), busy, lw=1.2, label=label)
    axis.axhline(200, color="grey", ls=":", lw=0.8, label="pool size")
    axis.set_xlabel("seconds")
    axis.set_ylabel("busy worker threads (max per s)")
    axis.set_title("Payment hangs: worker pool")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(plots / "overload-payment.png", dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="simulator reproductions for docs/overload.md")
    parser.add_argument("--quick", action="store_true", help="shorter phases")
    parser.add_argument("--plots", type=Path, default=Path("docs/img"))
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    plots: Path | None = None if args.no_plots else args.plots
    if plots is not None:
        plots.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    grpc(30.0 if args.quick else 100.0, plots)
    dagor(70.0 if args.quick else 120.0, 40.0 if args.quick else 60.0, plots)
    payments(60.0 if args.quick else 180.0, plots)
    print(f"_simulated in {time.perf_counter() - started:.1f} s of wall time_")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
