"""Helpers for the task-queue tests: worker processes on a throwaway Redis, and what they did.

Workers are real processes (``celery worker``, ``dramatiq``, ``arq``) started in their own
session, so a test can ``kill -9`` one worker with all its children, and always stopped by pid.
Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import redis

from servers import RedisServer, wait_until

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "task_apps"
BIN = Path(sys.executable).parent


class Workers:
    """Worker processes of one test; :meth:`stop` (or leaving the ``with``) kills them all."""

    def __init__(self, redis_url: str, logs: Path, **env: str) -> None:
        self.env = dict(
            os.environ,
            FW_REDIS=redis_url,
            PYTHONPATH=os.pathsep.join([str(APPS), str(ROOT / "src")]),
            C_FORCE_ROOT="1",
            **env,
        )
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *argv: str, name: str) -> subprocess.Popen[bytes]:
        """Start ``argv`` (a console script of this venv, then its arguments) in a session of
        its own, its output in ``<logs>/<name>.log``."""
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [str(BIN / argv[0]), *argv[1:]],
            cwd=APPS,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the worker and every process of its session; reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(proc)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # children left behind by a TERM

    def tail(self, lines: int = 40) -> str:
        out = []
        for log in sorted(self.logs.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def host_store_name() -> Iterator[str]:
    """A ``host://`` store name of the test's own; its IPC objects are removed afterwards
    (workers stopped with SIGTERM or SIGKILL may leave them)."""
    from floodwall.stores import host

    name = f"fw-tasks-{os.getpid()}-{time.monotonic_ns()}"
    try:
        yield name
    finally:
        host.remove(name, force=True)


def limit_figures(stamps: Sequence[float]) -> str:
    return f"{rate(stamps):5.1f}/s over the run, busiest second {busiest_second(stamps)}"


@contextlib.contextmanager
def throwaway_redis() -> Iterator[tuple[str, redis.Redis]]:
    """A Redis of the test's own (no state shared with other tests) and a client on it."""
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        try:
            yield server.url, client
        finally:
            client.close()


def until(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    logs: Workers,
    state: Callable[[], object] = lambda: None,
) -> None:
    """Wait for ``predicate``; fail with ``state()`` and the workers' logs when it does not
    come true."""
    if not wait_until(predicate, timeout, interval=0.05):
        raise AssertionError(
            f"timed out after {timeout:g}s waiting for {what}: {state()}\n{logs.tail()}"
        )


def times(db: redis.Redis, key: str) -> list[float]:
    """The wall-clock stamps a task pushed to ``key``, sorted."""
    return sorted(float(raw) for raw in db.lrange(key, 0, -1))


def rate(stamps: Sequence[float]) -> float:
    """Executions per second over the run: (n - 1) / (last - first)."""
    if len(stamps) < 2 or stamps[-1] == stamps[0]:
        return float("inf")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def busiest_second(stamps: Sequence[float]) -> int:
    """The most executions that started within any one second."""
    best, start = 0, 0
    for end, stamp in enumerate(stamps):
        while stamp - stamps[start] >= 1.0:
            start += 1
        best = max(best, end - start + 1)
    return best


def strings(db: redis.Redis, key: str) -> list[str]:
    """The list at ``key`` as text."""
    return [raw.decode() if isinstance(raw, bytes) else str(raw) for raw in db.lrange(key, 0, -1)]
