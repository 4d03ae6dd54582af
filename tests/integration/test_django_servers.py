"""The Django test project (``tests/djangoapp``) under real servers on loopback: gunicorn with
two sync workers (WSGI) and uvicorn (ASGI), each a process of its own (issue 21).

An overload is answered 429 and a dependency outage 503 (problem+json, ``Retry-After``), a
fallback answers with ``X-Degraded``, and the metrics show it: as under the test client and as
with FastAPI. Each worker process has its own in-memory registry (breakers and local limits are
per process: ``docs/django.md`` says why), so the test counts on "some", not "the n-th".
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servers import free_port, terminate, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

TESTS = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _serve(argv: list[str], port: int, down: Path, logs: Path) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(TESTS), str(TESTS.parent / "src")]),
        DJANGO_SETTINGS_MODULE="djangoapp.settings",
        FW_DOWN=str(down),
        FW_LIMIT="3/m",
    )
    with (logs / "server.log").open("ab") as log:
        proc = subprocess.Popen(
            [str(BIN / argv[0]), *argv[1:]],
            cwd=TESTS,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def answers() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return httpx.get(f"http://127.0.0.1:{port}/hello", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(answers, 30, interval=0.1)
    if proc.poll() is not None:
        raise RuntimeError((logs / "server.log").read_text(errors="replace"))
    return proc


SERVERS = {
    "gunicorn": lambda port: [
        "gunicorn", "-w", "2", "-k", "sync", "-b", f"127.0.0.1:{port}",
        "djangoapp.wsgi:application",
    ],
    "uvicorn": lambda port: [
        "uvicorn", "djangoapp.asgi:application", "--host", "127.0.0.1", "--port", str(port),
        "--no-access-log",
    ],
}  # fmt: skip


@pytest.fixture(params=list(SERVERS))
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    port = free_port()
    down = tmp_path / "down"
    proc = _serve(SERVERS[request.param](port), port, down, tmp_path)
    try:
        yield request.param, f"http://127.0.0.1:{port}", down
    finally:
        terminate([proc])


def test_django_server_answers_overload_and_outage_as_problems(
    server: tuple[str, str, Path],
) -> None:
    kind, url, down = server
    with httpx.Client(base_url=url, timeout=10) as client:
        hello = client.get("/hello", headers={"X-Request-Deadline": "2000"}).json()
        assert 1.0 < hello["remaining"] <= 2.0
        limited = [client.get("/limited") for _ in range(8)]  # 3/m per worker process
        refused = [a for a in limited if a.status_code == 429]
        assert refused, [a.status_code for a in limited]
        assert refused[0].headers["content-type"] == "application/problem+json"
        assert refused[0].json()["kind"] == "rate_limited"
        assert int(refused[0].headers["retry-after"]) >= 1

        down.touch()
        degraded = [client.get("/reviews") for _ in range(6)]
        assert all(a.json() == {"reviews": []} for a in degraded)
        assert all(a.headers["x-degraded"].startswith("reviews") for a in degraded)
        payments = [client.get("/payments") for _ in range(10)]
        statuses = [a.status_code for a in payments]
        assert set(statuses) <= {500, 503}, statuses
        open_answers = [a for a in payments if a.status_code == 503]
        assert open_answers, statuses
        assert open_answers[0].headers["content-type"] == "application/problem+json"
        assert open_answers[0].json()["kind"] == "circuit_open"
        assert 1 <= int(open_answers[0].headers["retry-after"]) <= 30

        # Each worker process answers for itself, and the kernel picks the worker for each
        # connection: scrape until some scrape has shown each figure (one worker may have
        # taken every refusal and the other every scrape of a short run, as seen in CI).
        opened = 'floodwall_circuit_breaker_state{resource="payments",state="open"} 1.0'
        refusals = 'floodwall_inbound_decisions_total{guard="http",outcome="refused"'
        unseen = {opened, refusals}
        for _ in range(60):
            scrape = client.get("/metrics").text
            unseen = {figure for figure in unseen if figure not in scrape}
            if not unseen:
                break
        assert not unseen, "no scrape of 60 showed these"
    down.unlink()
    print(f"\n{kind}: /payments statuses during the outage {statuses}")
