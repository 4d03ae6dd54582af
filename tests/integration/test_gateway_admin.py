"""The admin API: the token, live status, breaker and level overrides, reloads under load,
``/metrics``; and the global rate limit shared by two gateway processes on one Redis."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import GATEWAY_TOKEN, GatewayProcess, GatewayThread, Upstream
from servers import require_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

Start = Callable[[dict[str, Any]], GatewayThread]
WORKER_START = 60.0
"""Seconds a reload that starts worker processes may take (imports on a loaded machine)."""


def _config(a: Upstream, b: Upstream, *, timeout: str = "1s") -> dict[str, Any]:
    return {
        "upstreams": {
            "one": {"endpoints": [a.url]},
            "two": {"endpoints": [b.url]},
        },
        "resources": {
            "svc": {
                "timeout": timeout,
                "retry": {"attempts": 2, "backoff": {"kind": "none"}},
                "circuit_breaker": {"minimum_calls": 5},
                "bulkhead": {"max_concurrent": 50},
            }
        },
        "routes": [
            {"name": "api", "match": {"path_prefix": "/api"}, "upstream": "one", "resource": "svc"},
        ],
    }


def test_token_is_required_and_checked(
    upstreams: Callable[..., list[Upstream]], gateways: Start
) -> None:
    a, b = upstreams("a", "b")
    gw = gateways(_config(a, b))
    assert httpx.get(gw.admin_url + "/healthz").text == "ok"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": GATEWAY_TOKEN}):
        answer = httpx.get(gw.admin_url + "/status", headers=headers)
        assert answer.status_code == 401
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert httpx.post(gw.admin_url + "/shed/3").status_code == 401
    assert gw.admin("GET", "/status").status_code == 200


def test_status_overrides_and_metrics(
    upstreams: Callable[..., list[Upstream]], gateways: Start
) -> None:
    a, b = upstreams("a", "b")
    gw = gateways(_config(a, b))
    with httpx.Client(base_url=gw.url, timeout=5) as client:
        assert client.get("/api/1").status_code == 200
        assert gw.admin("POST", "/breakers/api/open").status_code == 200  # by route name
        refused = client.get("/api/2")
        assert refused.status_code == 503 and refused.json()["kind"] == "circuit_open"
        status = gw.admin("GET", "/status").json()
        assert status["routes"]["api"]["breaker"]["state"] == "FORCED_OPEN"
        assert status["overrides"][0]["action"] == "force_open"
        assert gw.admin("POST", "/breakers/svc/reset").status_code == 200  # by resource name
        assert client.get("/api/3").status_code == 200
        assert gw.admin("POST", "/breakers/nope/open").status_code == 400
        assert gw.admin("POST", "/shed/1").status_code == 400  # level 1 is never shed
        metrics = gw.admin("GET", "/metrics").text
    assert 'floodwall_gateway_requests_total{code="2xx",route="api"} 2.0' in metrics
    assert 'floodwall_gateway_outcomes_total{outcome="circuit_open",route="api"} 1.0' in metrics
    assert 'floodwall_circuit_breaker_state{resource="svc",state="closed"} 1.0' in metrics
    assert "floodwall_gateway_request_duration_seconds_bucket" in metrics
    assert 'floodwall_gateway_endpoint_up{endpoint="' in metrics
    lint = subprocess.run(
        [require_binary("promtool"), "check", "metrics"],
        input=metrics,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (lint.returncode, lint.stdout + lint.stderr) == (0, "")  # no name warnings


def test_reload_good_and_bad_under_load_loses_no_request(
    upstreams: Callable[..., list[Upstream]], gateways: Start
) -> None:
    a, b = upstreams("a", "b")
    gw = gateways(_config(a, b))
    statuses: list[int] = []
    served_by: set[str] = set()
    errors: list[BaseException] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=gw.url, timeout=5) as client:
            while not stop.is_set():
                try:
                    answer = client.get("/api/x")
                    statuses.append(answer.status_code)
                    served_by.add(answer.json()["upstream"])
                except httpx.HTTPError as exc:
                    errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.3)
        moved = _config(a, b)
        moved["routes"][0]["upstream"] = "two"
        moved["listen"] = "127.0.0.1:0"
        bad = json.loads(json.dumps(moved))
        bad["routes"][0]["upstream"] = "three"
        for _ in range(3):
            good = gw.admin("POST", "/reload?source=good.json", content=json.dumps(moved))
            assert good.status_code == 200, good.text
            time.sleep(0.15)
            refused = gw.admin("POST", "/reload?source=bad.json", content=json.dumps(bad))
            assert refused.status_code == 422
            assert "routes[0].upstream: no upstream named 'three'" in refused.json()["detail"]
            back = gw.admin("POST", "/reload?source=back.json", content=json.dumps(_config(a, b)))
            assert back.status_code == 200
            time.sleep(0.15)
        gw.admin("POST", "/reload?source=good.json", content=json.dumps(moved))
        time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors
    assert len(statuses) > 50 and set(statuses) == {200}
    assert served_by == {"a", "b"}
    status = gw.admin("GET", "/status").json()
    assert status["reloads"] == {"applied": 7, "rejected": 0}  # bad ones never reach a worker
    assert status["routes"]["api"]["upstream"] == "two"


def test_global_limit_is_shared_by_two_gateway_processes(
    upstreams: Callable[..., list[Upstream]], redis_url: str, redis_client: Any, tmp_path: Path
) -> None:
    (svc,) = upstreams("svc")
    config = {
        "stores": {"default": "memory://", "shared": redis_url},
        "upstreams": {"svc": {"endpoints": [svc.url]}},
        "routes": [
            {
                "name": "limited",
                "match": {"path_prefix": "/"},
                "upstream": "svc",
                "rate_limit": {
                    "rate": "20/10s",
                    "algorithm": "fixed",
                    "scope": "global",
                    "store": "shared",
                },
            }
        ],
    }
    first = GatewayProcess(config, tmp_path / "first.json").start()
    try:
        second = GatewayProcess(config, tmp_path / "second.json").start()
        try:
            svc.state.requests.clear()
            admitted = 0
            with httpx.Client(timeout=5) as client:
                for i in range(30):
                    gateway = first if i % 2 else second
                    answer = client.get(gateway.url + f"/{i}")
                    assert answer.status_code in (200, 429)
                    admitted += answer.status_code == 200
                    if answer.status_code == 429:
                        assert answer.headers["RateLimit-Limit"] == "20"
                        assert int(answer.headers["Retry-After"]) >= 1
            # Each alone would have admitted 15 of its 15; together they share 20 (minus the
            # probes GatewayProcess.start sent while waiting for the proxy).
            assert admitted <= 20
            assert svc.state.count == admitted
            assert admitted >= 15
        finally:
            assert second.stop() == 0
    finally:
        assert first.stop() == 0


def test_workers_share_the_port_and_stop_gracefully(
    upstreams: Callable[..., list[Upstream]], tmp_path: Path
) -> None:
    (svc,) = upstreams("svc")
    svc.state.delay = 0.05
    config = _one_route(svc)
    gateway = GatewayProcess(config, tmp_path / "workers.json", workers=2).start()
    try:
        with httpx.Client(timeout=5) as client:
            for _ in range(20):
                client.get(gateway.url + "/x", headers={"Connection": "close"})
        status = gateway.admin("GET", "/status").json()
        assert status["workers"] == 2
        assert status["routes"]["/"]["stats"]["requests"] >= 20
        assert gateway.admin("POST", "/shed/3").status_code == 200
        assert gateway.admin("GET", "/status").json()["shed_levels"] == [3]
        assert "worker=" in gateway.admin("GET", "/metrics").text
        svc.state.delay = 1.0
        slow: list[int] = []
        thread = threading.Thread(
            target=lambda: slow.append(httpx.get(gateway.url + "/slow", timeout=10).status_code)
        )
        thread.start()
        _until_upstream_has(svc, "/slow", 1)  # the request is in flight at the stop
    finally:
        code = gateway.stop()
    thread.join()
    assert slow == [200]  # the request in flight finished during the graceful stop
    assert code == 0


def _one_route(svc: Upstream, **top: Any) -> dict[str, Any]:
    """A gateway document: every path to ``svc`` (plus ``top``-level settings)."""
    return {
        **top,
        "upstreams": {"svc": {"endpoints": [svc.url]}},
        "routes": [{"match": {"path_prefix": "/"}, "upstream": "svc"}],
    }


def _post_reload(gateway: GatewayProcess, document: dict[str, Any], source: str) -> Any:
    """Reload ``gateway`` with ``document`` through its admin API (as long as new worker
    processes take to start on a busy machine)."""
    return httpx.post(
        gateway.admin_url + f"/reload?source={source}",
        content=json.dumps(document),
        headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"},
        timeout=WORKER_START,
    )


def _until_upstream_has(upstream: Upstream, path: str, count: int) -> None:
    """Wait (bounded) until ``upstream`` has received ``count`` requests for ``path``."""
    deadline = time.monotonic() + WORKER_START
    while sum(r["path"] == path for r in list(upstream.state.requests)) < count:
        assert time.monotonic() < deadline, f"{path} did not reach the upstream"
        time.sleep(0.01)


def _children(pid: int) -> set[int]:
    return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def test_a_worker_that_dies_is_restarted(
    upstreams: Callable[..., list[Upstream]], tmp_path: Path
) -> None:
    (svc,) = upstreams("svc")
    config = _one_route(svc)
    gateway = GatewayProcess(config, tmp_path / "restart.json", workers=2).start()
    try:
        assert gateway.proc is not None
        workers = _children(gateway.proc.pid)
        assert len(workers) == 2
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:
            now = _children(gateway.proc.pid)
            if len(now) == 2 and victim not in now:
                status = gateway.admin("GET", "/status")
                if status.status_code == 200 and status.json()["workers"] == 2:
                    break
            assert time.monotonic() < deadline, "the dead worker was not replaced"
            time.sleep(0.2)
        with httpx.Client(timeout=5) as client:  # new connections reach both workers again
            codes = {
                client.get(gateway.url + "/x", headers={"Connection": "close"}).status_code
                for _ in range(20)
            }
        assert codes == {200}
        served = gateway.admin("GET", "/status").json()["routes"]["/"]["stats"]["requests"]
        assert served >= 20
    finally:
        assert gateway.stop() == 0


def test_a_frozen_worker_is_reported_down_and_does_not_hold_the_admin_api(
    upstreams: Callable[..., list[Upstream]], tmp_path: Path
) -> None:
    """A worker frozen (SIGSTOP) answers no control call: ``/status`` and ``/metrics`` still
    answer, within the control timeout, with the other worker's figures and the frozen one
    named (``workers_down``, ``floodwall_gateway_worker_up 0``); once it resumes, both count."""
    from floodwall.gateway._control import CHANGE_TIMEOUT, READ_TIMEOUT

    (svc,) = upstreams("svc")
    config = _one_route(svc)
    gateway = GatewayProcess(config, tmp_path / "frozen.json", workers=2).start()
    assert gateway.proc is not None
    frozen = min(_children(gateway.proc.pid))
    os.kill(frozen, signal.SIGSTOP)
    try:
        started = time.monotonic()
        status = gateway.admin("GET", "/status")
        assert status.status_code == 200, status.text
        # (the control timeout, then the supervisor's answer: as long again on a busy machine)
        assert time.monotonic() - started < 2 * READ_TIMEOUT
        body = status.json()
        assert body["workers"] == 2 and body["workers_up"] == 1
        (down,) = body["workers_down"]
        assert down["pid"] == frozen and "no answer" in down["reason"]
        assert "/" in body["routes"]  # the answering worker's figures
        metrics = gateway.admin("GET", "/metrics")
        assert metrics.status_code == 200
        assert f'floodwall_gateway_worker_up{{worker="{down["worker"]}"}} 0' in metrics.text
        assert f'floodwall_gateway_worker_up{{worker="{1 - down["worker"]}"}} 1' in metrics.text
        # a reload reaches the worker that answers; the frozen one is replaced by a worker
        # started on the new configuration (not left on the old one, nor holding the reload)
        changed = json.loads(gateway.path.read_text())
        changed["routes"].append({"match": {"path_prefix": "/new"}, "upstream": "svc"})
        started = time.monotonic()
        answer = _post_reload(gateway, changed, "frozen.json")
        assert answer.status_code == 200, answer.text
        assert answer.json()["restarted"] == [down["worker"]]
        assert time.monotonic() - started < CHANGE_TIMEOUT + READ_TIMEOUT
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(frozen, signal.SIGCONT)
    try:
        deadline = time.monotonic() + WORKER_START
        while True:  # the replacement answers, on the new configuration
            body = gateway.admin("GET", "/status").json()
            if body["workers_up"] == 2:
                break
            assert time.monotonic() < deadline, body["workers_down"]
            time.sleep(0.2)
        assert frozen not in _children(gateway.proc.pid)
        assert body["workers_down"] == [] and "/new" in body["routes"]
        with httpx.Client(timeout=10) as client:  # both workers serve the new route
            codes = {
                client.get(gateway.url + "/new/x", headers={"Connection": "close"}).status_code
                for _ in range(20)
            }
        assert codes == {200}
        assert svc.state.count >= 20
    finally:
        assert gateway.stop() == 0


def test_overrides_in_force_carry_over_to_a_restarted_worker_and_a_handover(
    upstreams: Callable[..., list[Upstream]], tmp_path: Path
) -> None:
    """A shed level set by the operator holds on a worker restarted after a crash and on the
    next generation of a handover (every worker sheds the level-3 route), and one that ended
    stays ended (the level-2 route answers)."""
    (svc,) = upstreams("svc")
    config = {
        "resources": {"extra": {"level": 3}, "useful": {"level": 2}},
        "upstreams": {"svc": {"endpoints": [svc.url]}},
        "routes": [
            {"match": {"path_prefix": "/extra"}, "upstream": "svc", "resource": "extra"},
            {"match": {"path_prefix": "/useful"}, "upstream": "svc", "resource": "useful"},
        ],
    }

    def answers(path: str) -> set[int]:
        with httpx.Client(timeout=10) as client:  # (new connections: the kernel spreads them)
            return {
                client.get(gateway.url + path, headers={"Connection": "close"}).status_code
                for _ in range(20)
            }

    gateway = GatewayProcess(config, tmp_path / "kept.json", workers=2).start()
    assert gateway.proc is not None
    try:
        assert gateway.admin("POST", "/shed/3").status_code == 200
        assert gateway.admin("POST", "/shed/2").status_code == 200
        assert gateway.admin("DELETE", "/shed/2").status_code == 200
        victim = min(_children(gateway.proc.pid))
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + WORKER_START
        while True:  # both workers answer again: the replacement included
            body = gateway.admin("GET", "/status").json()
            if body["workers_up"] == 2 and victim not in _children(gateway.proc.pid):
                break
            assert time.monotonic() < deadline, body["workers_down"]
            time.sleep(0.2)
        assert answers("/extra/x") == {503} and answers("/useful/x") == {200}
        applied = json.loads(gateway.path.read_text())
        applied["workers"] = 1
        answer = _post_reload(gateway, applied, "kept.json")
        assert answer.status_code == 200, answer.text
        assert gateway.admin("GET", "/status").json()["shed_levels"] == [3]
        assert answers("/extra/x") == {503} and answers("/useful/x") == {200}
    finally:
        assert gateway.stop() == 0


def test_config_and_overrides_are_shared_through_redis(
    upstreams: Callable[..., list[Upstream]], redis_url: str, redis_client: Any, tmp_path: Path
) -> None:
    a, b = upstreams("a", "b")
    config = _config(a, b)
    config["stores"] = {"default": "memory://", "shared": redis_url}
    config["sync"] = {"store": "shared", "key": f"floodwall:test:{tmp_path.name}"}
    first = GatewayProcess(config, tmp_path / "first.json").start()
    try:
        second = GatewayProcess(config, tmp_path / "second.json").start()
        try:
            moved = json.loads(json.dumps(config))
            moved["routes"][0]["upstream"] = "two"
            answer = first.admin("POST", "/reload?source=moved.json", content=json.dumps(moved))
            assert answer.status_code == 200, answer.text
            assert first.admin("POST", "/shed/3").status_code == 200

            def second_follows() -> bool:
                status = second.admin("GET", "/status").json()
                return bool(
                    status["routes"]["api"]["upstream"] == "two" and status["shed_levels"] == [3]
                )

            deadline = time.monotonic() + 10
            while not second_follows():
                assert time.monotonic() < deadline, "the second gateway never applied the change"
                time.sleep(0.1)
            assert httpx.get(second.url + "/api/x", timeout=5).json()["upstream"] == "b"
            assert first.admin("POST", "/breakers/svc/closed?ttl=60").status_code == 200
            assert first.admin("POST", "/shed/2?ttl=60").status_code == 200
            assert first.admin("DELETE", "/shed/2").status_code == 200  # ended: not replayed
            assert first.admin("POST", "/breakers/api/open?ttl=0.2").status_code == 200
            time.sleep(0.5)  # that one expired on Redis's clock before the third gateway came
            third = GatewayProcess(config, tmp_path / "third.json").start()  # joins later
            try:
                assert httpx.get(third.url + "/api/x", timeout=5).json()["upstream"] == "b"
                status = third.admin("GET", "/status").json()
                assert status["shed_levels"] == [3]
                overrides = {(o["target"], o["action"]) for o in status["overrides"]}
                assert overrides == {("level:3", "shed"), ("svc", "force_closed")}
            finally:
                assert third.stop() == 0
        finally:
            assert second.stop() == 0
    finally:
        assert first.stop() == 0


def test_chaos_is_switched_on_and_off_through_the_admin_api(
    upstreams: Callable[..., list[Upstream]], gateways: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLOODWALL_CHAOS", raising=False)
    a, b = upstreams("a", "b")
    config = _config(a, b)
    config["resources"]["svc"]["chaos"] = {"exception": True, "enabled": False}
    refused = gateways(config)
    answer = refused.admin("POST", "/chaos/api")
    assert answer.status_code == 400
    assert "FLOODWALL_CHAOS" in answer.json()["detail"]  # not allowed: a loud no
    gw = gateways({**config, "allow_chaos": True})
    with httpx.Client(timeout=5) as client:
        assert client.get(gw.url + "/api/x").status_code == 200
        assert gw.admin("POST", "/chaos/api").status_code == 200
        status = gw.admin("GET", "/status").json()["routes"]["api"]["chaos"]
        assert status == {"fault": "exception", "enabled": True, "allowed": True, "rate": 1.0}
        broken = client.get(gw.url + "/api/x")
        assert broken.status_code == 502, broken.text  # the injected connection failure
        assert gw.admin("DELETE", "/chaos/api").status_code == 200
        assert client.get(gw.url + "/api/x").status_code == 200
    assert gw.admin("POST", "/chaos/api?ttl=5").status_code == 400  # a switch, not a timer


def test_listen_and_workers_change_under_steady_traffic_without_a_failed_request(
    upstreams: Callable[..., list[Upstream]], tmp_path: Path
) -> None:
    """A reload that changes ``workers`` (1 -> 2 -> 1) and ``listen`` hands over to a new
    generation of workers: new connections, keep-alive ones and a slow request in flight at
    each change are all answered."""
    from servers import free_port

    (svc,) = upstreams("svc")
    config: dict[str, Any] = _one_route(svc, workers=1)
    gateway = GatewayProcess(config, tmp_path / "handover.json").start()
    current = {"url": gateway.url}
    statuses: list[int] = []
    errors: list[str] = []
    slow: list[int] = []
    stop = threading.Event()

    def load(keep_alive: bool) -> None:
        headers = {} if keep_alive else {"Connection": "close"}
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                try:
                    statuses.append(client.get(current["url"] + "/x", headers=headers).status_code)
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))
                time.sleep(0.005)

    def slow_request() -> None:
        svc.state.delay = 1.0
        try:
            slow.append(httpx.get(current["url"] + "/slow", timeout=10).status_code)
        finally:
            svc.state.delay = 0.0

    applied: dict[str, Any] = json.loads(gateway.path.read_text())

    def reload(change: dict[str, Any]) -> dict[str, Any]:
        applied.update(change)
        document = applied
        thread = threading.Thread(target=slow_request)
        thread.start()
        _until_upstream_has(svc, "/slow", len(slow) + 1)  # in flight when the handover starts
        answer = _post_reload(gateway, document, "handover.json")
        assert answer.status_code == 200, answer.text
        if "listen" in change:
            current["url"] = f"http://{change['listen']}"
        time.sleep(1.0)  # traffic on the new generation, the old one drained
        thread.join()
        result: dict[str, Any] = answer.json()
        return result

    threads = [threading.Thread(target=load, args=(i == 0,)) for i in range(3)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        two = reload({"workers": 2})
        assert two["handover"]["workers"] == 2
        assert gateway.admin("GET", "/status").json()["workers"] == 2
        port = free_port()
        moved = reload({"listen": f"127.0.0.1:{port}"})
        assert moved["handover"] == {"listen": f"127.0.0.1:{port}", "workers": 2}
        one = reload({"workers": 1})
        assert one["handover"]["workers"] == 1
        status = gateway.admin("GET", "/status").json()
        assert status["workers"] == 1
        assert status["version"] == 4  # each generation carries the version on
    except Exception:
        print(gateway.log.read_text())  # (what each generation logged, for the failure)
        raise
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        code = gateway.stop()
    assert not errors, errors[:5]
    assert len(statuses) > 100 and set(statuses) == {200}
    assert slow == [200, 200, 200]  # each handover let the request in flight finish
    assert code == 0
    with pytest.raises(httpx.ConnectError):  # the first address was given up
        httpx.get(f"http://127.0.0.1:{gateway.port}/x", timeout=2)


@pytest.mark.timeout(400)
def test_worker_handovers_on_one_address_lose_no_queued_or_keep_alive_request(
    upstreams: Callable[..., list[Upstream]], tmp_path: Path
) -> None:
    """``workers`` 1 -> 2 -> 1 -> 2 -> 1 on one address under clients that keep their
    connections alive and clients that open one per request, sending back to back: the new
    generation serves the old one's listening sockets (a connection waiting in an accept queue
    is not reset) and a keep-alive connection is answered once more before it closes (no
    request races the close), so no request fails, of either kind."""
    (svc,) = upstreams("svc")
    config: dict[str, Any] = _one_route(svc, workers=1)
    gateway = GatewayProcess(config, tmp_path / "handover.json").start()
    answered = {True: 0, False: 0}
    errors: list[str] = []
    stop = threading.Event()

    def load(keep_alive: bool) -> None:
        headers = {} if keep_alive else {"Connection": "close"}
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                try:
                    status = client.get(gateway.url + "/x", headers=headers).status_code
                except httpx.HTTPError as exc:
                    errors.append(f"keep_alive={keep_alive}: {exc!r}")
                else:
                    assert status == 200
                    answered[keep_alive] += 1
                time.sleep(0.001)

    applied: dict[str, Any] = json.loads(gateway.path.read_text())
    threads = [threading.Thread(target=load, args=(i < 2,)) for i in range(5)]
    for thread in threads:
        thread.start()
    try:
        for workers in (2, 1, 2, 1):
            before = dict(answered)
            applied["workers"] = workers
            answer = _post_reload(gateway, applied, "handover.json")
            assert answer.status_code == 200, answer.text
            assert answer.json()["handover"]["workers"] == workers
            deadline = time.monotonic() + WORKER_START  # each kind answered by the new one
            while time.monotonic() < deadline and not all(
                answered[kind] > before[kind] + 50 for kind in (True, False)
            ):
                time.sleep(0.05)
    except Exception:
        print(gateway.log.read_text())
        raise
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        code = gateway.stop()
    assert not errors, errors[:5]
    assert code == 0


def _listening_sockets(port: int) -> set[int]:
    """The inodes of the TCP sockets listening on ``port`` (Linux's ``/proc/net/tcp``)."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    found.add(int(fields[9]))
    return found


def test_a_handover_on_one_address_keeps_its_listening_sockets(
    upstreams: Callable[..., list[Upstream]], tmp_path: Path
) -> None:
    """The supervisor owns the listening sockets: ``workers`` 1 -> 2 adds one beside the
    running one, 2 -> 1 keeps both (the one worker serves both queues), so no socket with
    connections waiting in its queue is ever closed; a new ``listen`` gets new sockets and the
    old address's close once the old generation is gone."""
    from servers import free_port

    (svc,) = upstreams("svc")
    config: dict[str, Any] = _one_route(svc, workers=1)
    gateway = GatewayProcess(config, tmp_path / "handover.json").start()
    applied: dict[str, Any] = json.loads(gateway.path.read_text())
    port = gateway.port

    def reload(change: dict[str, Any]) -> None:
        applied.update(change)
        answer = _post_reload(gateway, applied, "handover.json")
        assert answer.status_code == 200, answer.text

    try:
        first = _listening_sockets(port)
        assert len(first) == 1
        reload({"workers": 2})
        second = _listening_sockets(port)
        assert len(second) == 2 and first < second
        reload({"workers": 1})
        assert _listening_sockets(port) == second
        for _ in range(20):  # each socket's queue is served (the kernel spreads over both)
            assert httpx.get(gateway.url + "/x", headers={"Connection": "close"}).status_code == 200
        moved = free_port()
        reload({"listen": f"127.0.0.1:{moved}"})
        assert len(_listening_sockets(moved)) == 1
        deadline = time.monotonic() + WORKER_START  # the old generation drains, then its go
        while _listening_sockets(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _listening_sockets(port)
        assert httpx.get(f"http://127.0.0.1:{moved}/x").status_code == 200
    except Exception:
        print(gateway.log.read_text())
        raise
    finally:
        assert gateway.stop() == 0
