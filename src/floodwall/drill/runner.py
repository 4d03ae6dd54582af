"""Running a drill: start everything, apply the load and the faults, stop everything, keep the log.

:func:`run_mode` runs one mode of a scenario on the current event loop:

1. start each mock service on a free 127.0.0.1 port (its ledger in ``workdir``) and check that
   each running service's drill agent answers (:mod:`floodwall.drill.remote`), then start the
   edge (built from the mode's floodwall config, or unprotected) or the external edge's poller;
2. hand the running services their faults (their t = 0), fix the origin (t = 0), put the fault
   schedule on the mock services (chaos policies counted from the origin) and start the config
   patches, the resource sampler and the progress ticker;
3. send the load (open loop, bounded in time and count) and wait for its last answers;
4. drain: wait (at most the scenario's ``drain``) until the edge and the services have nothing
   in flight, so the ledger audit sees every write that was going to happen;
5. read the running services' logs, stop the edge, then the services (handlers still running
   after 0.5 s are cancelled; running services only drop their faults), read the ledgers and
   return the :class:`RunResult` with the raw :class:`EventLog`.

:func:`run_jobs` runs several modes (or scenarios) one after the other, or side by side in
separate processes (``parallel=True``: each has its own interpreter and event loop, so one
mode's meltdown does not slow the other's clock), reporting progress as it goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import queue as queue_module
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from floodwall.drill import faults as fault_schedule
from floodwall.drill._cpu_wait import CpuWait
from floodwall.drill._record import Recorder
from floodwall.drill.edge import ExternalEdge, LocalEdge
from floodwall.drill.load import LoadGenerator, arrivals
from floodwall.drill.metrics import EventLog, Figures, Sample, compute
from floodwall.drill.remote import RemoteService
from floodwall.drill.scenario import FaultSpec, Mode, Scenario
from floodwall.drill.services import MockService, read_ledger

__all__ = ["DrillError", "Job", "RunResult", "run_jobs", "run_mode"]

SAMPLE_EVERY = 0.25
"""Seconds between two resource samples."""
LAG_NOTE = 0.1
"""Seconds of event-loop lag past which a run's results carry a note (the machine was busy)."""
PROGRESS_EVERY = 0.25

Progress = Callable[[float, float], None]
"""``progress(elapsed, total)`` in seconds."""


class DrillError(RuntimeError):
    """A run could not complete (a process died, a server would not start)."""


@dataclass(frozen=True)
class Job:
    """One mode of one scenario to run; ledgers go to ``workdir``."""

    scenario: Scenario
    mode: Mode
    workdir: Path
    base_dir: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.scenario.name} · {self.mode.name}"

    @property
    def total(self) -> float:
        """An upper bound of the run's length in seconds (for progress bars)."""
        load = self.scenario.load
        return load.duration + load.timeout + self.scenario.drain


@dataclass
class RunResult:
    """What one run produced: the raw log, the figures computed from it, and context."""

    scenario: str
    mode: str
    log: EventLog
    figures: Figures
    protection: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    ledgers: list[str] = field(default_factory=list)
    endpoints: dict[str, str] = field(default_factory=dict)
    """Where each service and the edge listened (all stopped when the run returns)."""
    notes: list[str] = field(default_factory=list)
    """What went wrong around the run without stopping it (e.g. a status endpoint refusing)."""


def _resources() -> tuple[int, int, float]:
    """(OS threads, open sockets, resident MB) of this process; Linux /proc, else estimates."""
    threads = threading.active_count()
    sockets = 0
    rss_mb = 0.0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss_mb = int(line.split()[1]) / 1024
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    sockets += 1
    if not rss_mb:
        import resource

        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return threads, sockets, rss_mb


async def _sample(recorder: Recorder, edge: LocalEdge | ExternalEdge) -> None:
    pool = edge.pool if isinstance(edge, LocalEdge) else None
    waits = CpuWait()
    lag = 0.0
    while True:
        threads, sockets, rss_mb = _resources()
        busy = pool.busy if pool is not None else 0
        queued = pool.queued if pool is not None else 0
        now = recorder.now()
        sample = Sample(now, threads, sockets, rss_mb, busy, queued, lag, waits.read())
        recorder.sample(sample)
        await asyncio.sleep(SAMPLE_EVERY)
        lag = max(0.0, recorder.now() - now - SAMPLE_EVERY)


async def _tick(recorder: Recorder, total: float, progress: Progress) -> None:
    while True:
        progress(min(recorder.now(), total), total)
        await asyncio.sleep(PROGRESS_EVERY)


async def _stop(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


Service = MockService | RemoteService


async def _start_services(job: Job, recorder: Recorder) -> dict[str, Service]:
    services: dict[str, Service] = {}
    try:
        for name, spec in job.scenario.services.items():
            if spec.remote:
                services[name] = RemoteService(name, spec)
                await services[name].start()
                continue
            path = job.workdir / f"{name}.ledger.jsonl"
            path.unlink(missing_ok=True)
            mock = MockService(name, spec, recorder=recorder, ledger=path, seed=job.scenario.seed)
            services[name] = mock
            await mock.start()
    except BaseException:
        for service in services.values():
            await service.stop()
        raise
    return services


def _mocks(services: dict[str, Service]) -> dict[str, MockService]:
    return {name: s for name, s in services.items() if isinstance(s, MockService)}


def _remotes(services: dict[str, Service]) -> list[RemoteService]:
    return [s for s in services.values() if isinstance(s, RemoteService)]


async def _begin_remotes(job: Job, services: dict[str, Service]) -> None:
    """Hand each running service its faults; its t = 0 is when it takes them."""
    remotes = _remotes(services)
    faults: dict[str, list[tuple[int, FaultSpec]]] = {r.name: [] for r in remotes}
    for index, fault in enumerate(job.scenario.faults):
        if fault.service in faults:
            faults[fault.service].append((index, fault))
    seed = job.scenario.seed
    await asyncio.gather(*(r.begin(faults[r.name], seed) for r in remotes))


async def _remote_idle(services: dict[str, Service]) -> bool:
    remotes = _remotes(services)
    counts = await asyncio.gather(*(r.in_flight() for r in remotes))
    return not any(counts)


def _edge(job: Job, urls: dict[str, str], recorder: Recorder) -> LocalEdge | ExternalEdge:
    spec = job.scenario.edge
    if spec.kind == "external":
        return ExternalEdge(spec, recorder)
    return LocalEdge(
        spec, urls=urls, document=job.mode.document, client=job.mode.client, recorder=recorder
    )


def _schedule_faults(
    job: Job, services: dict[str, MockService], recorder: Recorder
) -> list[asyncio.Task[Any]]:
    """Put the mock services' faults in place (counted from the origin); start the config
    patches. (Running services took theirs in :func:`_begin_remotes`.)"""
    tasks = []
    scenario = job.scenario
    for index, fault in enumerate(scenario.faults):
        if fault.service is not None:
            if fault.service not in services:
                continue
            before, after = fault_schedule.service_faults(
                fault, index, origin=recorder.origin, seed=scenario.seed
            )
            services[fault.service].add_faults(before, after)
        else:
            patch = fault_schedule.ConfigPatch(fault, job.base_dir)
            tasks.append(asyncio.create_task(patch.run(recorder.origin)))
    return tasks


async def _drain(
    edge: LocalEdge | ExternalEdge, recorder: Recorder, seconds: float, services: dict[str, Service]
) -> None:
    """Wait until nothing is in flight at the edge or the services, at most ``seconds``."""
    until = recorder.now() + seconds
    # Polling: the counters belong to other tasks (or processes); signalling every decrement
    # would cost the request path more than a few wake-ups a second cost here.
    while recorder.now() < until:
        if edge.idle and recorder.in_flight_calls == 0 and await _remote_idle(services):
            return
        await asyncio.sleep(0.05)


async def run_mode(job: Job, progress: Progress | None = None) -> RunResult:
    """Run one mode of a scenario (see [Chaos drills][guide-drills]); every server is stopped on
    exit."""
    scenario = job.scenario
    started = time.monotonic()
    job.workdir.mkdir(parents=True, exist_ok=True)
    recorder = Recorder()
    services = await _start_services(job, recorder)
    mocks = _mocks(services)
    edge: LocalEdge | ExternalEdge | None = None
    background: list[asyncio.Task[Any]] = []
    try:
        edge = _edge(job, {name: s.url for name, s in services.items()}, recorder)
        base_url = await edge.start()
        schedule = arrivals(scenario.load, scenario.edge.routes, scenario.seed)
        await _begin_remotes(job, services)
        recorder.origin = time.monotonic()
        background = _schedule_faults(job, mocks, recorder)
        background.append(asyncio.create_task(_sample(recorder, edge)))
        if progress is not None:
            background.append(asyncio.create_task(_tick(recorder, job.total, progress)))
        await LoadGenerator(
            schedule,
            base_url,
            timeout=scenario.load.timeout,
            max_in_flight=scenario.load.max_in_flight,
            recorder=recorder,
            observe_degraded=scenario.edge.kind == "external",
        ).run()
        await _drain(edge, recorder, scenario.drain, services)
        end = recorder.now()
        for remote in _remotes(services):
            await remote.collect(recorder)
    finally:
        for task in background:
            await _stop(task)
        if edge is not None:
            await edge.stop()
        for service in services.values():
            await service.stop()
    if progress is not None:
        progress(job.total, job.total)
    log = _log(job, recorder, mocks, end)
    return RunResult(
        scenario=scenario.name,
        mode=job.mode.name,
        log=log,
        figures=compute(log),
        protection=edge.protection(),
        wall_s=time.monotonic() - started,
        ledgers=[str(service.ledger.path) for service in mocks.values()],
        endpoints={**{name: s.url for name, s in services.items()}, "edge": base_url},
        notes=_notes(edge, log),
    )


def _notes(edge: LocalEdge | ExternalEdge, log: EventLog) -> list[str]:
    notes = edge.notes() if isinstance(edge, ExternalEdge) else []
    lag = max((s.loop_lag for s in log.samples), default=0.0)
    if lag > LAG_NOTE:
        notes.append(
            f"the run's event loop fell {lag * 1000:.0f} ms behind at worst: the machine was "
            "busy, and latency figures include that delay"
        )
    return notes


def _log(job: Job, recorder: Recorder, services: dict[str, MockService], end: float) -> EventLog:
    scenario = job.scenario
    writes = [w for name, s in services.items() for w in read_ledger(s.ledger.path, name)]
    return EventLog(
        routes={route.path: route.calls for route in scenario.edge.routes},
        timeout=scenario.load.timeout,
        warmup=scenario.warmup,
        load_end=scenario.load.duration,
        end=end,
        requests=sorted(recorder.requests, key=lambda r: r.start),
        calls=recorder.calls(),
        actions=sorted(recorder.actions, key=lambda a: a.time),
        faults=fault_schedule.windows(scenario),
        samples=recorder.samples,
        writes=sorted(writes, key=lambda w: w.time),
    )


# -- several runs ----------------------------------------------------------------------------

JobProgress = Callable[[int, float, float], None]
"""``progress(job index, elapsed, total)``."""


def run_jobs(
    jobs: Sequence[Job], *, parallel: bool = True, progress: JobProgress | None = None
) -> list[RunResult]:
    """Run every job: side by side in separate processes (``parallel``), or one after the other
    in this process. Results come back in the jobs' order."""
    if not parallel or len(jobs) < 2:
        results = []
        for index, job in enumerate(jobs):
            report = _bind(progress, index)
            results.append(asyncio.run(run_mode(job, report)))
        return results
    return _in_processes(jobs, progress)


def _bind(progress: JobProgress | None, index: int) -> Progress | None:
    if progress is None:
        return None

    def report(elapsed: float, total: float) -> None:
        progress(index, elapsed, total)

    return report


class _Worker:
    """One job in a fresh interpreter (``python -m floodwall.drill._worker JOB RESULT``): the
    job and its result travel as pickle files, progress as lines on its stdout. A fresh
    interpreter, not ``multiprocessing``: nothing of the caller's ``__main__`` is re-run."""

    def __init__(self, index: int, job: Job, folder: Path) -> None:
        self.index = index
        self.job = job
        self.job_file = folder / f"job-{index}.pickle"
        self.result_file = folder / f"result-{index}.pickle"
        self.error_file = folder / f"stderr-{index}.txt"
        self.job_file.write_bytes(pickle.dumps(job))
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=package_root + (os.pathsep + path if path else ""))
        with self.error_file.open("wb") as errors:
            self.process = subprocess.Popen(  # noqa: S603 - our own module, our own interpreter
                [
                    sys.executable,
                    "-m",
                    "floodwall.drill._worker",
                    str(self.job_file),
                    str(self.result_file),
                ],
                stdout=subprocess.PIPE,
                stderr=errors,
                stdin=subprocess.DEVNULL,
                env=env,
                text=True,
            )
        self.reader = threading.Thread(target=self._read, daemon=True, name=f"drill-{index}")
        self.lines: queue_module.Queue[tuple[int, float, float]] = queue_module.Queue()
        self.reader.start()

    def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        for line in stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "progress":
                self.lines.put((self.index, float(parts[1]), float(parts[2])))

    def result(self) -> RunResult:
        self.reader.join(timeout=5)
        code = self.process.returncode
        if code != 0 or not self.result_file.exists():
            errors = self.error_file.read_text(errors="replace")[-4000:]
            raise DrillError(f"{self.job.label} failed (exit code {code}):\n{errors}")
        result: RunResult = pickle.loads(self.result_file.read_bytes())  # noqa: S301 - ours
        return result

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


def _in_processes(jobs: Sequence[Job], progress: JobProgress | None) -> list[RunResult]:
    deadline = time.monotonic() + max(job.total for job in jobs) + 60.0
    with tempfile.TemporaryDirectory(prefix="floodwall-drill-") as folder:
        workers: list[_Worker] = []
        try:
            for index, job in enumerate(jobs):
                workers.append(_Worker(index, job, Path(folder)))
            while any(w.process.poll() is None for w in workers):
                if time.monotonic() > deadline:
                    raise DrillError("the drill ran past its bound; stopping it")
                _forward(workers, progress)
                time.sleep(0.1)
            _forward(workers, progress)
            return [worker.result() for worker in workers]
        finally:
            for worker in workers:
                worker.stop()


def _forward(workers: Sequence[_Worker], progress: JobProgress | None) -> None:
    for worker in workers:
        while True:
            try:
                index, elapsed, total = worker.lines.get_nowait()
            except queue_module.Empty:
                break
            if progress is not None:
                progress(index, elapsed, total)
