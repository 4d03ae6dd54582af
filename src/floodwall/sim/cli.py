"""``floodwall simulate scenario.yaml``: run a scenario and print one row per phase."""

from __future__ import annotations

import sys

from floodwall.sim.scenario import format_report, run_scenario

__all__ = ["simulate"]


def simulate(path: str) -> None:
    """Run the scenario at ``path`` (YAML or JSON) and print its per-phase report."""
    result = run_scenario(path)
    sys.stdout.write(format_report(result) + "\n")
