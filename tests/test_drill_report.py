"""The drill's report formats: the comparison table, JSON, and the HTML page's structure."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from pathlib import Path

from floodwall.drill.metrics import (
    DEFINITIONS,
    RECOVERY_HOLD,
    RECOVERY_WINDOW,
    VOID_BASELINE,
    VOID_CPU_WAIT,
    VOID_LOOP_LAG,
    VOID_SEND_LAG,
    EventLog,
    FaultWindow,
    Request,
    Sample,
    Write,
    compute,
)
from floodwall.drill.report import (
    ScenarioReport,
    html_report,
    render_text,
    table_rows,
    to_json,
    verdict,
)
from floodwall.drill.runner import RunResult


def run(mode: str, doubled: bool) -> RunResult:
    requests = [Request(i, "/pay", i * 0.1, i * 0.1 + 0.05, 200, order=f"o{i}") for i in range(50)]
    requests += [Request(100 + i, "/read", i * 0.1, i * 0.1 + 0.02, 200) for i in range(50)]
    writes = [Write("pay", r.end, r.order or "") for r in requests if r.order]
    if doubled:
        writes += writes[:3]
    log = EventLog(
        routes={"/pay": ("pay",), "/read": ("db",)},
        timeout=1.0,
        warmup=0.5,
        load_end=5.0,
        end=5.2,
        requests=requests,
        faults=[FaultWindow("pay", 1.0, 3.0, "hangs 4s")],
        writes=writes,
    )
    return RunResult("payments", mode, log, compute(log), {"pay": "unprotected"}, 6.1)


REPORTS = [
    ScenarioReport(
        "payments", "charges </script>", [run("unprotected", True), run("protected", False)], 64
    )
]


def test_the_comparison_table() -> None:
    header, rows = table_rows(REPORTS)
    assert header == ["figure", "payments\nunprotected", "payments\nprotected"]
    by_label = {row[0]: row[1:] for row in rows}
    assert by_label["doubled / lost writes"] == ["3 / 0", "0 / 0"]
    assert by_label["detection (open / shed)"] == ["never", "never"]
    assert by_label["first protective action"] == ["never", "never"]
    assert by_label["comparison"] == ["valid", "valid"]
    assert by_label["doubled / lost per ledger"] == ["pay 3 / 0", "pay 0 / 0"]
    assert by_label["healthy success, fault"] == ["100.0 %", "100.0 %"]
    assert by_label["healthy p99 before → fault"] == ["20 → 20 ms", "20 → 20 ms"]
    text = render_text(REPORTS)
    assert text.splitlines()[0].split() == [
        "figure",
        "payments",
        "·",
        "unprotected",
        "payments",
        "·",
        "protected",
    ]
    assert "3 / 0" in text


def test_json_holds_every_figure() -> None:
    data = to_json(REPORTS)
    bare = data["payments"]["unprotected"]
    assert bare["doubled_writes"] == 3 and bare["lost_writes"] == 0
    assert bare["detection_time_s"] is None
    assert bare["protection"] == {"pay": "unprotected"} and bare["wall_s"] == 6.1
    json.dumps(data, allow_nan=False)


def test_the_page_is_self_contained_and_escaped() -> None:
    page = html_report(REPORTS, title="t <i>")
    assert page.startswith("<!doctype html>")
    assert "<title>t &lt;i&gt;</title>" in page
    assert "charges &lt;/script&gt;" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    payload = page.split('id="drill-data">', 1)[1].split("</script>", 1)[0]
    data = json.loads(payload)
    assert [r["mode"] for r in data["scenarios"][0]["runs"]] == ["unprotected", "protected"]
    assert data["scenarios"][0]["runs"][0]["series"]["faults"] == [[1.0, 3.0, "pay", "hangs 4s"]]


def test_a_run_that_waited_for_a_core_shows_it_and_gives_no_verdict() -> None:
    """Run-queue wait in the worst second before and during the fault, in ms per second, in the
    table (a dash without /proc); over half a second voids the comparison."""
    starved = run("protected", False)
    # every 0.25 s: 0.1 s waited per second, 0.8 from 1.5 s to 2.5 s (the fault: 1 s to 3 s)
    steps = [0.025] * 6 + [0.2] * 4 + [0.025] * 2
    totals = [sum(steps[:index]) for index in range(len(steps) + 1)]
    samples = [Sample(i * 0.25, 1, 4, 40.0, cpu_wait=total) for i, total in enumerate(totals)]
    log = dataclasses.replace(starved.log, samples=samples)
    starved = dataclasses.replace(starved, log=log, figures=compute(log))
    report = ScenarioReport("payments", "", [run("unprotected", True), starved], 64)
    rows = {row[0]: row[1:] for row in table_rows([report])[1]}
    assert rows["CPU wait, worst s before → fault"] == ["—", "100 → 800 ms/s"]
    assert rows["comparison"] == ["valid", "VOID"]
    assert "protected: the run's threads waited for a core 800 ms in a second" in verdict(report)


def test_item7_a_run_that_fell_behind_gives_no_verdict() -> None:
    """Issue 19, item 7: a comparison with a run whose load generator fell behind prints that
    it is void instead of a verdict, in the table, the verdict line and the HTML report."""
    valid = verdict(REPORTS[0])
    assert valid.startswith("verdict (payments): unprotected: healthy routes 100.0 %")
    assert "doubled / lost writes 3 / 0" in valid
    behind = run("protected", False)
    late = [dataclasses.replace(r, late=0.4) for r in behind.log.requests]
    log = dataclasses.replace(behind.log, requests=late)
    behind = dataclasses.replace(behind, log=log, figures=compute(log))
    report = ScenarioReport("payments", "", [run("unprotected", True), behind], 64)
    said = verdict(report)
    assert said.startswith("no verdict (payments): the comparison is void; protected: the load")
    _, rows = table_rows([report])
    assert {row[0]: row[1:] for row in rows}["comparison"] == ["valid", "VOID"]
    page = html_report([report])
    assert "<p class='void'>no verdict (payments)" in page


def test_item7_one_definition_of_each_figure_everywhere() -> None:
    """Issue 19, item 7: the command line's table and the HTML report print the figures'
    definitions, and the chaos-drill guide and the operating guide state the same ones."""
    text, page = render_text(REPORTS), html_report(REPORTS)
    for name, definition in DEFINITIONS:
        assert f"{name}: {definition}" in text
        assert html.escape(definition) in page
    root = Path(__file__).resolve().parent.parent / "docs"
    drills = " ".join((root / "drills.md").read_text(encoding="utf-8").split())
    operating = " ".join((root / "operating.md").read_text(encoding="utf-8").split())
    assert (RECOVERY_HOLD, RECOVERY_WINDOW) == (2, 2.0)
    assert "**2 back-to-back windows of 2 s**" in drills
    assert "stay back for two 2 s windows" in operating
    assert "took the faulty dependency out of the path" in drills
    assert "took the dependency out of the path (its breaker opened, or load was shed)" in operating
    assert "the first thing the protection did about the faulty dependency" in operating
    assert (
        "**10 % of the caller's timeout**" in drills
        and "**25 % of the caller's timeout**" in drills
        and "**5 % of the healthy routes' requests before the first fault**" in drills
        and "**over half of a second before or during the fault**" in drills
    )
    assert (VOID_SEND_LAG, VOID_LOOP_LAG, VOID_BASELINE, VOID_CPU_WAIT) == (0.1, 0.25, 0.05, 0.5)
