"""Issue 19, "done when": a drill over the seeds' order system (``examples/drills/orders.yaml``:
an order service writing every order to inventory and to analytics, analytics failing) reports
doubled, lost and charged-but-told-failed orders per ledger, and each figure matches a count
made here directly on the ledger files the mock services wrote."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from floodwall.drill import load_scenario
from floodwall.drill.report import ScenarioReport, render_text, to_json
from floodwall.drill.runner import Job, RunResult, run_jobs

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.xdist_group("drill"),  # real servers and real time: one drill at a time
]

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "drills" / "orders.yaml"


def ledger_counts(path: Path) -> Counter[str]:
    """Order id -> lines in one ledger file, read straight from the JSON lines."""
    counts: Counter[str] = Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            counts[json.loads(line)["order"]] += 1
    return counts


def direct_audit(result: RunResult) -> dict[str, dict[str, list[str]]]:
    """Per ledger file: the orders applied twice or more, the orders callers were told
    succeeded that it never applied, and those it applied while the caller saw a failure."""
    told = {r.order: r.ok for r in result.log.requests if r.order is not None}
    out = {}
    for path in map(Path, result.ledgers):
        service = path.name.removesuffix(".ledger.jsonl")
        counts = ledger_counts(path)
        out[service] = {
            "doubled_orders": sorted(o for o, n in counts.items() if n > 1),
            "lost_orders": sorted(o for o, ok in told.items() if ok and not counts[o]),
            "unconfirmed_orders": sorted(o for o, ok in told.items() if not ok and counts[o]),
        }
    return out


def test_item6_a_drill_over_the_order_system_audits_each_ledger(tmp_path: Path) -> None:
    scenario, modes = load_scenario(SCENARIO)
    jobs = [Job(scenario, m, tmp_path / m.name, base_dir=SCENARIO.parent) for m in modes]
    unprotected, protected = run_jobs(jobs, parallel=True)

    for result in (unprotected, protected):
        audit = result.figures.audit
        assert set(audit) == {"inventory", "analytics"}
        direct = direct_audit(result)
        assert set(direct) == set(audit)
        for service, counted in direct.items():
            reported = {key: audit[service][key] for key in counted}
            assert reported == counted, (result.mode, service)
            assert audit[service]["doubled"] == len(counted["doubled_orders"])
            assert audit[service]["lost"] == len(counted["lost_orders"])
            assert audit[service]["applied"] == sum(
                ledger_counts(tmp_path / result.mode / f"{service}.ledger.jsonl").values()
            )
        figures = result.figures
        assert figures.doubled_writes == sum(a["doubled"] for a in audit.values())
        assert figures.lost_writes == sum(a["lost"] for a in audit.values())
        assert figures.unconfirmed_writes == sum(a["unconfirmed"] for a in audit.values())
        # Orders on both ledgers once: the audit of old called each of them doubled.
        inventory = ledger_counts(tmp_path / result.mode / "inventory.ledger.jsonl")
        analytics = ledger_counts(tmp_path / result.mode / "analytics.ledger.jsonl")
        once_each = {o for o in inventory if inventory[o] == 1 and analytics[o] == 1}
        assert once_each
        doubled = {o for a in audit.values() for o in a["doubled_orders"]}
        assert not once_each & doubled

    bare, guarded = unprotected.figures.audit, protected.figures.audit
    report = ScenarioReport(scenario.name, scenario.description, [unprotected, protected], 40)
    text = render_text([report])
    print(text)
    row = next(line for line in text.splitlines() if line.startswith("doubled / lost per ledger"))
    a, i = guarded["analytics"], guarded["inventory"]
    assert f"analytics {a['doubled']} / {a['lost']} · inventory {i['doubled']} / {i['lost']}" in row
    assert to_json([report])["orders"]["protected"]["audit"] == guarded
    if unprotected.figures.void or protected.figures.void:  # the machine set the pace
        print(f"void on this machine: {unprotected.figures.void or protected.figures.void}")
        return  # the audit above holds whatever the load; what the faults did does not
    # Unprotected: blind retries of hung analytics writes double them there, never in
    # inventory; an order whose analytics tries all failed was told failed, inventory took it.
    assert bare["analytics"]["doubled"] > 0 and bare["inventory"]["doubled"] == 0
    assert bare["inventory"]["unconfirmed"] > 0
    # Protected: analytics' fallback answered for its failures; those orders are lost on
    # analytics (callers told success), on no other ledger; nothing doubled, nothing failed.
    assert guarded["analytics"]["lost"] > 0 and guarded["inventory"]["lost"] == 0
    assert protected.figures.doubled_writes == 0
    assert guarded["inventory"]["unconfirmed"] == 0
