"""The README's run command: the demo shows an outage contained and recovered, for real."""

from __future__ import annotations

import pytest

from floodwall._demo import run_demo, summarize


@pytest.mark.integration
async def test_demo_contains_the_outage_and_recovers() -> None:
    lines: list[str] = []
    tally = await run_demo(lines.append, healthy_first=0.6, down_for=3.0, healthy_after=2.0)
    states = [e.to_state for _, e in tally.events]
    assert "OPEN" in states
    assert states[-1] == "CLOSED"
    assert tally.fresh > 0
    assert tally.degraded > 0
    assert tally.reached_while_down < tally.calls_while_down  # the breaker kept some away
    summary = summarize(tally)
    assert summary[0].endswith("0 errors")
    assert any(line.startswith("detected: breaker opened") for line in summary)
    assert any(line.startswith("recovered: breaker closed") for line in summary)
