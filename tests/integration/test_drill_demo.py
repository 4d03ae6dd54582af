"""``floodwall demo --quick --json``: the issue's "Done when" figures, from the JSON it writes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from floodwall.drill.cli import demo
from floodwall.drill.demo import (
    DEMO_KEYS,
    REVIEWS_OPEN_DURATION,
    REVIEWS_TIMEOUT,
    REVIEWS_WINDOW,
    product_page,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(90),
    pytest.mark.xdist_group("drill"),  # real servers and real time: one drill at a time
]


def test_the_quick_demo_shows_the_avalanche_and_its_containment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    begun = time.monotonic()
    demo(str(tmp_path / "demo.json"), str(tmp_path / "report.html"), quick=True)
    wall = time.monotonic() - begun
    assert wall < 45

    figures = json.loads((tmp_path / "demo.json").read_text())
    assert set(figures) == {"product_page", "payments"}
    for scenario in figures.values():
        assert set(scenario) == {"unprotected", "protected"}
        for mode in scenario.values():
            assert set(DEMO_KEYS) <= set(mode)

    notes = {s: {m: f["notes"] for m, f in modes.items()} for s, modes in figures.items()}
    out = capsys.readouterr().out
    assert "HTML report:" in out and str(tmp_path / "report.html") in out
    assert (tmp_path / "report.html").stat().st_size > 10_000
    # A story whose load generator or event loop fell behind (a busy machine) says so instead
    # of a verdict (issue 19, item 7); its figures measured the machine and are not judged.
    void = {
        story: [m["void"] for m in modes.values() if m["void"]] for story, modes in figures.items()
    }
    for story, reasons in void.items():
        if reasons:
            assert f"no verdict ({story}): the comparison is void" in out, out
            print(f"{story}: void on this machine, figures not judged: {reasons}")
        else:
            assert f"verdict ({story}): unprotected: healthy routes" in out, out

    page = figures["product_page"]
    bare, guarded = page["unprotected"], page["protected"]
    for mode in (bare, guarded):
        assert mode["doubled_writes"] is None and mode["lost_writes"] is None
        assert mode["audit"] == {}
    if not void["product_page"]:
        # unprotected: reviews hang, and product and price die with them: the workers are all
        # held by review calls once `workers / (rate of calls to reviews)` seconds of the fault
        # have passed, after which healthy requests only wait out the caller's timeout, so at
        # most (that + the timeout) / the fault's length of them succeed (57 % here; 51 % seen
        # under a CPU hog, 18 % in the long demo)
        story = product_page(quick=True)
        mix = story["load"]["mix"]
        to_reviews = sum(n for path, n in mix.items() if path in ("/reviews", "/page")) / sum(
            mix.values()
        )
        dry = story["edge"]["workers"] / (story["load"]["rate"] * to_reviews)
        (fault,) = story["faults"]
        survive = (dry + float(story["load"]["timeout"].rstrip("s"))) / (
            fault["until"] - fault["at"]
        )
        assert bare["healthy_success_rate"] <= survive, (bare, survive)
        assert bare["detection_time_s"] is None and bare["first_action_s"] is None
        # protected: healthy routes unharmed, the fault noticed and the breaker open fast,
        # recovery (held for its windows) within the breaker's open duration
        # (demo.py's PRODUCT_BULKHEAD: with the seeds' 20, 98.59 % in CI, and every healthy
        # failure of the loaded runs measured since was a 503 from the product or price
        # bulkhead; 98.59 % again, and 100 % with 30, under a loop kept 90 % busy in the fault)
        assert guarded["healthy_success_rate"] >= 0.99, (guarded, notes)
        # A stall of the event loop the load generator, the edge and the mock services share
        # delays every request in flight by its length, whatever the protection does (the mock
        # product service's own answers stayed within 250 ms while the edge's grew): the margin
        # is the worst stall this run measured, as for detection below.
        stall = guarded["peak_loop_lag_ms"]
        assert guarded["healthy_p99_ms_during"] <= 1.5 * guarded["healthy_p99_ms_before"] + stall, (
            guarded,
            notes,
        )
        # The breaker opens once failures are half its window: the successes recorded before the
        # fault leave the window as failures (one per call, each after the timeout) enter it, so
        # at about (window + timeout) / 2 at any steady rate, plus one of its ten buckets; the
        # margin is the event loop's worst lag this run measured (a void run is not judged).
        opened_by = (REVIEWS_WINDOW + REVIEWS_TIMEOUT) / 2 + REVIEWS_WINDOW / 10
        margin = guarded["peak_loop_lag_ms"] / 1000 + 0.2
        assert guarded["first_action_s"] <= guarded["detection_time_s"] <= opened_by + margin, (
            guarded,
            notes,
        )
        assert guarded["recovery_time_s"] is not None
        assert guarded["recovery_time_s"] <= REVIEWS_OPEN_DURATION + 2.0

    pay = figures["payments"]
    if not void["payments"]:
        assert pay["unprotected"]["doubled_writes"] > 0  # blind retries charged twice
        assert (
            pay["unprotected"]["audit"]["payments"]["doubled"]
            == pay["unprotected"]["doubled_writes"]
        )
        assert pay["protected"]["doubled_writes"] == 0
        assert pay["protected"]["lost_writes"] == 0
        assert pay["protected"]["first_action_s"] <= 2.0  # its timeouts; no breaker opens
        assert pay["protected"]["amplification"] >= 1.0  # retries happened, under the budget
