"""Chaos drills: mock services, an edge under test, open-loop load, faults, figures, reports.

``floodwall drill scenario.yaml`` runs a scenario (:mod:`floodwall.drill.scenario`) and reports
what the seeds' drills measure: detection time, blast radius, recovery time, data consistency,
retry amplification and resources (:mod:`floodwall.drill.metrics`), in the terminal, as JSON
and as a self-contained HTML report (:mod:`floodwall.drill.report`). ``floodwall demo``
(:mod:`floodwall.drill.demo`) runs the seeds' two stories, unprotected and protected.

Needs the ``gateway`` (aiohttp, pydantic, PyYAML) extra; ``rich`` (the ``cli`` extra) draws the
progress bars and tables when it is installed.
"""

from floodwall.drill.metrics import EventLog, Figures, compute
from floodwall.drill.runner import DrillError, Job, RunResult, run_jobs, run_mode
from floodwall.drill.scenario import Mode, Scenario, load_scenario, parse_scenario

__all__ = [
    "DrillError",
    "EventLog",
    "Figures",
    "Job",
    "Mode",
    "RunResult",
    "Scenario",
    "compute",
    "load_scenario",
    "parse_scenario",
    "run_jobs",
    "run_mode",
]
