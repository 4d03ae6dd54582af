"""Host-wide policies across real processes: gunicorn (4 sync workers) and uvicorn (4 workers)
in front of a real loopback dependency that counts its concurrent calls, ``kill -9`` of a worker
mid-call, 8 processes x 10 000 slot cycles under random SIGKILLs, and a rate limit shared by 4
processes. Every test uses its own ``host://`` NAME and asserts that nothing of it is left
(what ``ipcs`` shows)."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from floodwall.stores.host import HostStore, info, keys_of, remove
from servers import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="System V: Linux"),
    pytest.mark.xdist_group("host"),  # real processes and real time: one at a time
]

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


class Dependency:
    """A loopback HTTP server that counts the calls in flight (the figure that matters) and
    which worker pids are inside one; ``hold`` keeps calls inside until released (<= 20 s)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.current = self.max_seen = self.calls = 0
        self.inside: set[int] = set()
        self.released = threading.Event()
        self.released.set()
        dependency = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                pid = int(self.headers.get("X-Pid", "0"))
                with dependency.lock:
                    dependency.current += 1
                    dependency.calls += 1
                    dependency.max_seen = max(dependency.max_seen, dependency.current)
                    dependency.inside.add(pid)
                try:
                    time.sleep(dependency.delay)
                    dependency.released.wait(20)
                finally:
                    with dependency.lock:
                        dependency.current -= 1
                        dependency.inside.discard(pid)
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the worker was killed mid-call: the test's point

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def _ours(name: str) -> set[str]:
    """The ``ipcs`` lines of NAME's objects (by key): empty once cleaned up."""
    sem, shm = (f"{key:#010x}" for key in keys_of(name))
    listing = subprocess.run(["ipcs", "-s", "-m"], capture_output=True, text=True, check=True)
    return {line for line in listing.stdout.splitlines() if line.startswith((sem, shm))}


@pytest.fixture
def name() -> Iterator[str]:
    value = f"t{uuid.uuid4().hex[:16]}"
    yield value
    left = _ours(value)
    remove(value, force=True)
    assert not left, f"left behind: {left}"


def _env(name: str, dep: Dependency, size: int) -> dict[str, str]:
    path = os.pathsep.join([str(HERE), str(SRC), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "HOST_NAME": name,
        "DEP_URL": dep.url,
        "SIZE": str(size),
    }


def _serve(kind: str, name: str, dep: Dependency, size: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if kind == "gunicorn":
        command = [sys.executable, "-m", "gunicorn", "-w", "4", "-k", "sync", "--timeout", "60"]
        command += ["-b", f"127.0.0.1:{port}", "host_app:wsgi"]
    else:
        command = [sys.executable, "-m", "uvicorn", "--workers", "4", "--port", str(port)]
        command += ["--host", "127.0.0.1", "--log-level", "warning", "host_app:asgi"]
    server = subprocess.Popen(command, env=_env(name, dep, size), cwd=HERE)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=20) as answer:
                answer.read()
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise
            time.sleep(0.2)
    return server, url


def _stop(server: subprocess.Popen[bytes]) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def _hammer(url: str, clients: int, seconds: float) -> dict[int, int]:
    """``clients`` threads calling ``url`` for ``seconds``, each at least once; how many
    answers of each status (``0``: the connection closed with no answer, as a worker killed
    mid-call leaves it). At least once: under a CPU hog on both cores a thread started later
    than a 0.01 s run's end, and its caller never called."""
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client() -> None:
        first = True
        while first or time.monotonic() < end:
            first = False
            try:
                with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310
                    status = answer.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except (http.client.RemoteDisconnected, ConnectionError):
                status = 0
            with lock:
                statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    return statuses


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("kind", "size"), [("gunicorn", 2), ("uvicorn", 3)])
def test_the_dependency_never_sees_more_than_the_bulkhead(kind: str, size: int, name: str) -> None:
    """gunicorn's sync workers take one request each (4 at once without the host bulkhead:
    a per-process bulkhead of 2 would never refuse); uvicorn's take 12 clients at once."""
    dep = Dependency(delay=0.05)
    server, url = _serve(kind, name, dep, size)
    try:
        with dep.lock:
            dep.max_seen = 0
        statuses = _hammer(url, clients=12, seconds=3.0)
        print(f"{kind}: statuses {statuses}, max concurrent at the dependency {dep.max_seen}")
        assert dep.max_seen <= size
        assert dep.max_seen == size, "loaded enough to fill the bulkhead"
        assert statuses.get(503, 0) > 0 and statuses.get(200, 0) > 0
        assert statuses.get(0, 0) == 0, "every request answered"
    finally:
        _stop(server)
        dep.close()
    if kind == "uvicorn":  # its supervisor ends workers with a signal: no exit handler runs
        left = info(name)
        assert left.users == 0 and left.bulkheads == (("dependency", size, size),)
        assert remove(name), "stale, harmless (every slot back), removed as documented"
    assert not _ours(name), "the semaphores and the segment are gone"


@pytest.mark.timeout(240)
def test_a_worker_killed_mid_call_gives_its_slot_back_within_a_second(name: str) -> None:
    dep = Dependency(delay=0.0)
    server, url = _serve("gunicorn", name, dep, 2)
    try:
        dep.released.clear()  # calls now stay inside the dependency
        callers = [threading.Thread(target=_hammer, args=(url, 1, 0.01)) for _ in range(4)]
        for caller in callers:
            caller.start()
        deadline = time.monotonic() + 20
        while len(dep.inside) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(dep.inside) == 2
        assert info(name).bulkheads == (("dependency", 2, 0),)
        victim = next(iter(dep.inside))
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        while info(name).bulkheads[0][2] != 1 and time.monotonic() - killed < 5:
            time.sleep(0.001)
        back = time.monotonic() - killed
        print(f"slot back {back * 1000:.1f} ms after kill -9 of worker {victim}")
        assert info(name).bulkheads[0][2] == 1 and back < 1.0
        dep.released.set()
        for caller in callers:
            caller.join(60)
    finally:
        _stop(server)
        dep.close()
    assert not _ours(name)


_SLOTS_WORKER = """
import sys, time
from floodwall.stores.host import HostStore
store = HostStore("host://" + sys.argv[1])
slots = store.slots("storm", int(sys.argv[2]))
print("ready", flush=True)
sys.stdin.readline()  # go: every worker starts at once
for _ in range(int(sys.argv[3])):
    if not slots.take():
        assert slots.wait(10.0), "no slot within 10 s: a slot was lost"
    slots.give()
store.close()
"""


@pytest.mark.timeout(300)
def test_eight_processes_ten_thousand_cycles_random_sigkills_lose_no_slot(name: str) -> None:
    size, cycles, rng = 4, 10_000, random.Random(21)
    before = _ours(name)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    owner = HostStore(f"host://{name}")
    slots = owner.slots("storm", size)

    def start() -> subprocess.Popen[str]:
        command = [sys.executable, "-c", _SLOTS_WORKER, name, str(size), str(cycles)]
        child = subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        return child

    def go(child: subprocess.Popen[str]) -> None:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.close()

    workers = [start() for _ in range(8)]
    for worker in workers:
        go(worker)
    kills = 0
    end = time.monotonic() + 120
    while kills < 8 and time.monotonic() < end:
        time.sleep(rng.uniform(0.001, 0.01))
        running = [w for w in workers if w.poll() is None]
        if not running:
            break
        victim = rng.choice(running)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        kills += 1
        workers.append(start())  # a replacement does its full 10 000 cycles
        go(workers[-1])
    codes = [w.wait(120) for w in workers]
    finished = sum(code == 0 for code in codes)
    print(f"{kills} SIGKILLs, {finished} workers finished 10 000 cycles, free {slots.free}/{size}")
    assert kills >= 4 and finished >= 8
    assert all(code in (0, -signal.SIGKILL) for code in codes), codes
    assert slots.free == size, "every killed worker's slot came back"
    assert info(name).users == 1, "only this test's store still counts"
    during = _ours(name)
    owner.close()
    after = _ours(name)
    print(f"ipcs lines of NAME: before {len(before)}, during {len(during)}, after {len(after)}")
    assert not before and len(during) == 2 and not after


_RATE_WORKER = """
import json, sys, time
from floodwall.shared.global_limit import GlobalLimiter
limiter = GlobalLimiter("gcra", "20/s", burst=4, store="host://" + sys.argv[1], name="shared")
limiter.try_acquire("warm-up")
print("ready", flush=True)
start = float(sys.stdin.readline())
while time.monotonic() < start:
    time.sleep(0.001)
admitted = []
while time.monotonic() < start + 1.5:
    if limiter.try_acquire():
        admitted.append(time.monotonic())
    time.sleep(0.0005)
print(json.dumps(admitted), flush=True)
limiter.close()
"""


@pytest.mark.timeout(120)
def test_a_rate_limit_shared_by_four_processes_admits_its_bound(name: str) -> None:
    rate, burst = 20.0, 4
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-c", _RATE_WORKER, name]
    children = [
        subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    start = time.monotonic() + 0.3
    for child in children:
        assert child.stdin is not None
        child.stdin.write(f"{start}\n")
        child.stdin.flush()
    times: list[float] = []
    per_process = []
    for child in children:
        out, _ = child.communicate(timeout=60)
        got = json.loads(out.strip().splitlines()[-1])
        per_process.append(len(got))
        times.extend(got)
    times.sort()
    bound = burst + 1 + rate * 1.5
    print(f"admitted {len(times)} (per process {per_process}), bound {bound:g} in 1.5 s")
    assert len(times) <= bound
    assert len(times) >= rate * 1.5 * 0.5, "the processes did share the quota, not starve"
    assert sum(n > 0 for n in per_process) >= 2
    for i, first in enumerate(times):  # any interval: at most burst + 1 + rate x its length
        for j in range(i, len(times)):
            # +1: a timestamp is taken just after its decision, not at it
            assert j - i + 1 <= burst + 1 + rate * (times[j] - first) + 1
