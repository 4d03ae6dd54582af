"""One endpoint of two fails after its answer's head: its body stalls (issue 20's fault variants).

The endpoint is a real process (``benchmarks/fault_endpoint.py``, the one
``benchmarks/endpoint_faults.py`` runs beside nginx and HAProxy) switched to ``stall-big``
(the head and 16 KiB of a 256 KiB body, which the gateway streams) or ``stall-small`` (the
head and 100 bytes of 1 KiB, which it reads whole first), then nothing. A stalled body is the
endpoint's failure like a missing head: each counts as a ``timeout`` against it, and the
answer's 200 head no longer ends the run of failures before its body is whole, so five in a
row eject it; it serves again once healed and its ejection is over.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import GatewayThread
from servers import free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Start = Callable[[dict[str, Any]], GatewayThread]
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fault_endpoint.py"
SIZES = {"/big": 256 * 1024, "/small": 1024}
READ_TIMEOUT = 0.3
"""Seconds without a body byte that end a try (a loopback answer's body takes well under 10 ms
between two pieces)."""
BASE_EJECTION = 2.0
FAILURES = 5


class EndpointProcess:
    """``fault_endpoint.py`` on a free port, its fault switched by signals."""

    def __init__(self, kind: str, log: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(self.port), kind, str(log)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.log = log
        assert wait_until(self._listening, timeout=10), "the endpoint process did not listen"

    def _listening(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
            return True
        return False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answered(self) -> int:
        return len(self.log.read_text(encoding="utf-8").split()) if self.log.exists() else 0

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


@pytest.fixture
def endpoint_pair(tmp_path: Path) -> Iterator[Callable[[str], tuple[EndpointProcess, ...]]]:
    started: list[EndpointProcess] = []

    def start(kind: str) -> tuple[EndpointProcess, ...]:
        pair = tuple(EndpointProcess(kind, tmp_path / f"{kind}-{i}.log") for i in range(2))
        started.extend(pair)
        return pair

    try:
        yield start
    finally:
        for endpoint in started:
            endpoint.stop()


def _config(good: EndpointProcess, stalling: EndpointProcess) -> dict[str, Any]:
    outliers = {"consecutive_gateway_failures": FAILURES, "base_ejection_time": BASE_EJECTION}
    return {
        "upstreams": {
            "pool": {
                "endpoints": [good.url, stalling.url],
                "read_timeout": READ_TIMEOUT,
                "outlier_detection": outliers,
            }
        },
        "routes": [{"match": {"path_prefix": "/"}, "upstream": "pool"}],
    }


def _get(client: httpx.Client, path: str) -> bool:
    """Whether ``path`` came back 200 with its whole body."""
    try:
        answer = client.get(path)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and len(answer.content) == SIZES[path]


def _endpoint(gw: GatewayThread, url: str) -> dict[str, Any]:
    endpoints = gw.admin("GET", "/status").json()["upstreams"]["pool"]["endpoints"]
    return next(e for e in endpoints if e["url"] == url)


@pytest.mark.parametrize(("kind", "path"), [("stall-big", "/big"), ("stall-small", "/small")])
def test_an_endpoint_whose_bodies_stall_is_ejected_and_comes_back(
    endpoint_pair: Callable[[str], tuple[EndpointProcess, ...]],
    gateways: Start,
    kind: str,
    path: str,
) -> None:
    good, stalling = endpoint_pair(kind)
    gw = gateways(_config(good, stalling))
    with httpx.Client(base_url=gw.url, timeout=5) as client:
        assert all(_get(client, path) for _ in range(4))  # both endpoints serve
        stalling.proc.send_signal(signal.SIGUSR1)
        failed = 0
        for _ in range(4 * FAILURES):  # round robin: every other request reaches it
            failed += not _get(client, path)
            if _endpoint(gw, stalling.url)["ejected"]:
                break
        shown = _endpoint(gw, stalling.url)
        assert shown["ejected"], shown
        assert failed == FAILURES, shown
        assert shown["last_failure"] == "timeout"
        assert shown["failures_by_reason"]["timeout"] == FAILURES
        # ejected: every request goes to the other endpoint, whole
        before = good.answered()
        assert all(_get(client, path) for _ in range(10))
        assert good.answered() == before + 10

        stalling.proc.send_signal(signal.SIGUSR2)  # healed: back once its ejection is over
        before = stalling.answered()
        deadline = time.monotonic() + BASE_EJECTION + 5
        while stalling.answered() < before + 2 and time.monotonic() < deadline:
            assert _get(client, path)
            time.sleep(0.05)
    assert stalling.answered() >= before + 2, "the healed endpoint never served again"
    back = _endpoint(gw, stalling.url)
    assert back["state"] == "up" and back["consecutive_failures"] == 0


def test_a_small_body_that_stalls_is_tried_on_the_other_endpoint(
    endpoint_pair: Callable[[str], tuple[EndpointProcess, ...]], gateways: Start
) -> None:
    """A small answer is read within its try: nothing went to the client yet, so with a retry
    the request is answered by the other endpoint, whole, while the stalling one is ejected."""
    good, stalling = endpoint_pair("stall-small")
    config = _config(good, stalling)
    config["resources"] = {"pool": {"retry": {"attempts": 2, "budget": {"ratio": 0.5}}}}
    config["routes"][0]["resource"] = "pool"
    gw = gateways(config)
    answered = []
    with httpx.Client(base_url=gw.url, timeout=5) as client:
        stalling.proc.send_signal(signal.SIGUSR1)
        for _ in range(4 * FAILURES):
            answered.append(_get(client, "/small"))
            if _endpoint(gw, stalling.url)["ejected"]:
                break
    assert all(answered), answered.count(False)
    shown = _endpoint(gw, stalling.url)
    assert shown["ejected"], shown
    assert shown["failures_by_reason"]["timeout"] == FAILURES, shown
    assert gw.admin("GET", "/status").json()["upstreams"]["pool"]["retries_elsewhere"] == 0
