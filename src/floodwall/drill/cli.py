"""The ``floodwall drill`` and ``floodwall demo`` commands (wired into :mod:`floodwall.cli`).

Both print a progress bar per run while the drill runs, then the comparison table, the verdict
and the path of the HTML report; ``json_out`` also writes every figure as JSON. ``drill`` checks
the scenario's ``expect`` section and exits with status 1 when a figure misses it, or when a
run's load generator or event loop fell behind, it waited for a core, or its healthy routes
failed before the fault
(the comparison is void: no verdict, and no pass either); an invalid scenario raises
:class:`~floodwall.ConfigError` (its message names the path in the file).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from floodwall.drill.demo import run_demo, show
from floodwall.drill.report import ScenarioReport, print_table, to_json, verdict, write_html
from floodwall.drill.runner import Job, JobProgress, run_jobs
from floodwall.drill.scenario import Scenario, check_expectation, load_scenario

__all__ = ["demo", "drill"]


def _say(text: str) -> None:
    try:
        from rich.console import Console
    except ImportError:  # pragma: no cover - the cli extra brings rich
        print(text)
        return
    Console(highlight=False, soft_wrap=True).print(text)


@contextmanager
def _progress_view() -> Iterator[Any]:
    """A factory ``jobs -> progress callback``: rich bars when rich is there, else quiet."""
    try:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:  # pragma: no cover - the cli extra brings rich
        yield None
        return
    bars = Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        TextColumn("{task.completed:>5.1f} / {task.total:.0f} s"),
        TimeElapsedColumn(),
        transient=False,
    )

    def factory(jobs: Sequence[Job]) -> JobProgress:
        tasks = [bars.add_task(job.label, total=job.total) for job in jobs]

        def report(index: int, elapsed: float, total: float) -> None:
            bars.update(tasks[index], completed=elapsed, total=total)

        return report

    with bars:
        yield factory


def _write_json(path: str, data: object) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def demo(json_out: str | None, html_out: str | None, quick: bool) -> None:
    """Run the demo (see :mod:`floodwall.drill.demo`), print the table and the report's path;
    ``json_out``: also write ``{scenario: {mode: figures}}`` there."""
    _say(
        "[bold]floodwall demo[/]: two outages from the seeds, each run without protection and "
        "with floodwall, side by side on 127.0.0.1."
    )
    with _progress_view() as factory:
        result = run_demo(quick=quick, html_out=html_out, say=_say, progress=factory)
    show(result, say=_say)
    if json_out is not None:
        _write_json(json_out, result.figures)
        _say(f"JSON: {Path(json_out).resolve()}")


def _parallel(scenario: Scenario) -> bool:
    """Modes may run side by side unless they share fixed ports or an external edge."""
    fixed = any(spec.port for spec in scenario.services.values())
    return scenario.edge.kind == "local" and not fixed


def _expectations(scenario: Scenario, report: ScenarioReport) -> list[str]:
    """One line per failed check of the scenario's ``expect`` section."""
    failed = []
    for run in report.runs:
        figures = run.figures.as_dict()
        for figure, check in scenario.expect.get(run.mode, {}).items():
            value = figures.get(figure)
            if not check_expectation(value, check):
                failed.append(f"{run.mode}: {figure} = {value!r}, expected {check}")
    return failed


def drill(path: str, json_out: str | None, html_out: str | None) -> None:
    """Run the scenario at ``path`` (every mode), print the table, write the HTML report (to
    ``html_out``, default a temporary directory) and the JSON (``json_out``); exit with status
    1 when a figure misses the scenario's ``expect`` section."""
    scenario, modes = load_scenario(path)
    html = Path(html_out) if html_out else _default_html(scenario.name)
    base_dir = Path(path).resolve().parent
    jobs = [
        Job(scenario, mode, html.parent / "ledgers" / mode.name, base_dir=base_dir)
        for mode in modes
    ]
    _say(f"[bold]drill[/] {scenario.name}: {scenario.description or path}")
    for fault in scenario.faults:
        until = "end" if fault.until is None else f"{fault.until:g}s"
        _say(f"  fault {fault.at:g}s..{until}: {fault.target} {fault.what}")
    with _progress_view() as factory:
        results = run_jobs(
            jobs, parallel=_parallel(scenario), progress=factory(jobs) if factory else None
        )
    workers = scenario.edge.workers if scenario.edge.kind == "local" else None
    report = ScenarioReport(scenario.name, scenario.description, results, workers=workers)
    print_table([report], title=f"drill {scenario.name}")
    for run in results:
        for note in run.notes:
            _say(f"[yellow]note ({run.mode}):[/] {note}")
    said = verdict(report)
    void = said.startswith("no verdict")
    _say(f"[red]{said}[/]" if void else said)
    written = write_html(html, [report], title=f"floodwall drill: {scenario.name}")
    _say(f"HTML report: {written}")
    failed = [] if void else _expectations(scenario, report)
    if json_out is not None:
        data: dict[str, Any] = to_json([report])
        data["expect"] = {"failed": failed, "checked": scenario.expect, "void": void}
        _write_json(json_out, data)
        _say(f"JSON: {Path(json_out).resolve()}")
    if void:  # the figures measured the machine: no verdict, so no pass (exit 1)
        sys.exit(1)
    for line in failed:
        _say(f"[red]expectation missed:[/] {line}")
    if failed:
        sys.exit(1)
    if scenario.expect:
        _say("[green]every expectation met[/]")


def _default_html(name: str) -> Path:
    return Path(tempfile.gettempdir()) / "floodwall-drill" / name / "report.html"
