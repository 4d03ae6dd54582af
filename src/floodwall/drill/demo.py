"""``floodwall demo``: the seeds' two stories, each unprotected and protected, side by side.

1. **The product-detail page** (the seeds' avalanche): an edge service with 100 worker threads
   calls product, price and reviews. The review service slows down by 5 s. Unprotected, slow
   reviews hold every worker in turn and the product and price pages die with them.
   Protected (bulkheads 30/30/20, timeouts, a breaker and a fallback for reviews), the page
   loses its reviews for a while and nothing else.
2. **The payment story**: 5 % of the calls to the payment service hang; half of those hang
   after the charge was applied ("the response timed out but the money moved"). Unprotected,
   the checkout service gives up after 1 s and retries blindly: customers are charged twice.
   Protected (idempotency keys, an idempotent payment service, a retry budget), nobody is.

Everything runs on 127.0.0.1 (mock services and the edge are real aiohttp servers; no Redis,
no other server), each mode in a process of its own, in about a minute (``quick``: about 25 s,
what the test suite runs; its load lasts long enough after the faults for recovery to be seen
holding, :data:`~floodwall.drill.metrics.RECOVERY_HOLD` windows). The run ends with the
comparison table, each story's verdict (or that its comparison is void) and the path of the HTML
report; :func:`run_demo` returns every figure as :data:`DemoResult.figures`, the object
``floodwall demo --json PATH`` writes.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from floodwall.drill.report import ScenarioReport, print_table, to_json, verdict, write_html
from floodwall.drill.runner import Job, JobProgress, run_jobs
from floodwall.drill.scenario import Mode, Scenario, parse_scenario

__all__ = ["DEMO_KEYS", "DemoResult", "payments", "product_page", "run_demo"]

DEMO_KEYS = (
    "healthy_success_rate",
    "healthy_p99_ms_before",
    "healthy_p99_ms_during",
    "first_action_s",
    "detection_time_s",
    "recovery_time_s",
    "doubled_writes",
    "lost_writes",
    "audit",
    "amplification",
    "peak_loop_lag_ms",
    "cpu_wait_share_before",
    "cpu_wait_share_during",
    "void",
)
"""Figures every mode object of the demo's JSON holds (``None`` where they do not apply)."""

REVIEWS_OPEN_DURATION = 3.0
"""Seconds the reviews breaker stays open (recovery is judged against it)."""
REVIEWS_WINDOW = 5.0
"""Seconds of the reviews breaker's failure-rate window (detection is judged against it)."""
REVIEWS_TIMEOUT = 0.3
"""Seconds the protected edge waits for reviews before its fallback answers."""
PRODUCT_BULKHEAD = 30
"""Product calls the protected edge lets in at once, as many as price (same rate, same
latency). The seeds' 20 held 0.4 s of the quick demo's 50 product calls/s; on a busy machine
the run's one event loop (load, edge and mock services) stretches the edge's product calls to
0.5 to 0.9 s while the run stays valid, and that bulkhead answered healthy requests 503: with
the loop kept 90 % busy for 3 s of the fault (loop lag 181 ms, load sent 113 ms late), 20 gave
98.59 % healthy success, CI's figure (10 rejections), and 30 gave 100 % (none)."""


def product_page(quick: bool = False) -> dict[str, Any]:
    """The product-detail page scenario (``examples/drills/product_page.yaml`` is the long one)."""
    duration, at, until = (19, 4, 11) if quick else (30, 8, 20)
    rate = 100 if quick else 150  # the quick run shares the machine with a test suite
    breaker = {"minimum_calls": 20, "failure_rate": 0.5, "window": "10s", "open_duration": "3s"}
    protected = {
        "resources": {
            "product": {
                "level": 1,
                "timeout": "1s",
                "bulkhead": {"max_concurrent": PRODUCT_BULKHEAD},
                "circuit_breaker": breaker,
            },
            "price": {
                "level": 1,
                "timeout": "1s",
                "bulkhead": {"max_concurrent": 30},
                "circuit_breaker": breaker,
            },
            "reviews": {
                "level": 3,
                "timeout": REVIEWS_TIMEOUT,
                "bulkhead": {"max_concurrent": 20},
                "circuit_breaker": {
                    "minimum_calls": 10,
                    "failure_rate": 0.5,
                    "window": REVIEWS_WINDOW,
                    "open_duration": REVIEWS_OPEN_DURATION,
                },
                "fallback": {"value": []},
            },
        }
    }
    return {
        "name": "product_page",
        "description": "The seeds' product-detail page: 100 worker threads call product, price "
        f"and reviews; from {at} s to {until} s the review service answers 5 s late.",
        "seed": 1,
        "warmup": 1.5 if quick else 2.0,
        "drain": 3.0 if quick else 6.0,
        "services": {
            "product": {"latency": {"lognormal": {"median": "80ms", "sigma": 0.2}}},
            "price": {"latency": {"lognormal": {"median": "70ms", "sigma": 0.2}}},
            "reviews": {"latency": {"lognormal": {"median": "60ms", "sigma": 0.2}}},
        },
        "edge": {
            "workers": 100,
            "queue": 200,
            "routes": [
                {"path": "/product", "calls": ["product"]},
                {"path": "/price", "calls": ["price"]},
                {"path": "/reviews", "calls": ["reviews"]},
                {"path": "/page", "calls": ["product", "price", "reviews"]},
            ],
        },
        "load": {
            "duration": duration,
            "rate": rate,
            "timeout": "2s",
            "mix": {"/product": 3, "/price": 3, "/reviews": 2, "/page": 2}
            if not quick
            else {"/product": 1, "/price": 1, "/reviews": 1, "/page": 1},
        },
        "faults": [{"at": at, "until": until, "service": "reviews", "latency": "5s"}],
        "modes": {"unprotected": {"config": None}, "protected": {"config": protected}},
    }


def payments(quick: bool = False) -> dict[str, Any]:
    """The payment scenario (``examples/drills/payments.yaml`` is the long one)."""
    duration, at, until = (14, 3, 9) if quick else (20, 5, 15)
    protected = {
        "resources": {
            "payments": {
                "level": 1,
                "timeout": "500ms",
                "retry": {
                    "attempts": 3,
                    "idempotent": False,
                    "backoff": {"kind": "fixed", "base": "50ms"},
                    "budget": {"ratio": 0.1},
                },
                "bulkhead": {"max_concurrent": 40},
                "circuit_breaker": {
                    "minimum_calls": 40,
                    "failure_rate": 0.6,
                    "open_duration": "3s",
                },
            },
            "orders": {"level": 1, "timeout": "1s", "bulkhead": {"max_concurrent": 20}},
        }
    }
    return {
        "name": "payments",
        "description": f"The seeds' payment story: from {at} s to {until} s, 5 % of payment "
        "calls hang for 4 s, half of them after the charge was applied.",
        "seed": 2,
        "warmup": 1.0,
        "drain": 6.0,
        "services": {
            "payments": {
                "latency": {"lognormal": {"median": "80ms", "sigma": 0.3}},
                "idempotent": True,
            },
            "orders": {"latency": {"lognormal": {"median": "30ms", "sigma": 0.25}}},
        },
        "edge": {
            "workers": 64,
            "queue": 64,
            "routes": [
                {"path": "/checkout", "method": "POST", "calls": ["payments"]},
                {"path": "/orders", "calls": ["orders"]},
            ],
        },
        "load": {
            "duration": duration,
            "rate": 100,
            "timeout": "3s",
            "mix": {"/checkout": 3, "/orders": 2},
        },
        "faults": [
            {
                "at": at,
                "until": until,
                "service": "payments",
                "rate": 0.05,
                "hang": {"duration": "4s", "after_apply": 0.5},
            }
        ],
        "modes": {
            "unprotected": {
                "config": None,
                "client": {"timeout": "1s", "retries": 2, "idempotency_keys": False},
            },
            "protected": {"config": protected},
        },
    }


@dataclass(frozen=True)
class DemoResult:
    """What the demo measured: ``figures`` is ``{scenario: {mode: {figure: value}}}``."""

    figures: dict[str, dict[str, dict[str, Any]]]
    reports: list[ScenarioReport]
    html: Path
    wall_s: float


Say = Callable[[str], object]

_STORY = {
    "product_page": (
        "Story 1, the product page: {rate:g} requests/s to an edge with 100 worker threads that "
        "calls product, price and reviews. Then the review service slows down by 5 s."
    ),
    "payments": (
        "Story 2, payments: {rate:g} requests/s, 60 % of them checkouts. Then 5 % of payment "
        "calls hang for 4 s, half of them after the money moved."
    ),
}


def _story(scenario: Scenario) -> str:
    return _STORY[scenario.name].format(rate=scenario.load.rate or scenario.load.peak_rate)


def _jobs(quick: bool, workdir: Path) -> list[tuple[Scenario, list[Mode], list[Job]]]:
    out = []
    for raw in (product_page(quick), payments(quick)):
        scenario, modes = parse_scenario(raw, f"<demo:{raw['name']}>")
        jobs = [Job(scenario, m, workdir / scenario.name / m.name) for m in modes]
        out.append((scenario, modes, jobs))
    return out


def run_demo(
    *,
    quick: bool = False,
    html_out: str | Path | None = None,
    say: Say = print,
    progress: Callable[[list[Job]], JobProgress | None] | None = None,
) -> DemoResult:
    """Run both stories, unprotected and protected (see [Chaos drills][guide-drills]).

    ``quick`` shortens every phase (about 25 s in all, both stories at once). ``progress`` is
    given the jobs about to run and returns the per-job progress callback (or ``None``).
    """
    started = time.monotonic()
    html = Path(html_out) if html_out is not None else _default_html()
    stories = _jobs(quick, html.parent / "ledgers")
    results = []
    if quick:
        jobs = [job for _, _, story_jobs in stories for job in story_jobs]
        for scenario, _, _ in stories:
            say(_story(scenario))
        results = run_jobs(jobs, parallel=True, progress=progress(jobs) if progress else None)
    else:
        for scenario, _, jobs in stories:
            say(_story(scenario))
            report = progress(jobs) if progress else None
            results.extend(run_jobs(jobs, parallel=True, progress=report))
    reports = [
        ScenarioReport(
            scenario.name,
            scenario.description,
            [r for r in results if r.scenario == scenario.name],
            workers=scenario.edge.workers,
        )
        for scenario, _, _ in stories
    ]
    figures = {name: _demo_figures(modes) for name, modes in to_json(reports).items()}
    path = write_html(html, reports, title="floodwall demo: the avalanche, and how it is stopped")
    return DemoResult(figures, reports, path, time.monotonic() - started)


def _demo_figures(modes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each mode's figures with the demo's keys first (every key present)."""
    out = {}
    for mode, figures in modes.items():
        ordered = {key: figures.get(key) for key in DEMO_KEYS}
        ordered.update({k: v for k, v in figures.items() if k not in ordered})
        out[mode] = ordered
    return out


def _default_html() -> Path:
    return Path(tempfile.gettempdir()) / "floodwall-demo" / "report.html"


def show(result: DemoResult, say: Say = print) -> None:
    """Print the comparison table, each story's verdict (or that its comparison is void, when
    a run's load or event loop fell behind, it waited for a core, or its baseline failed) and
    where the report is."""
    print_table(result.reports, title="floodwall demo: unprotected vs protected")
    for report in result.reports:
        for run in report.runs:
            for note in run.notes:
                say(f"note ({report.name}, {run.mode}): {note}")
        say(verdict(report))
    say(f"HTML report: {result.html}")
    say(f"({result.wall_s:.0f} s)")
