"""Mock services and the edge, for real on 127.0.0.1: latency, errors, capacity, ledgers,
idempotent writes, faults switching on and off on schedule, servers that really stop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from floodwall.drill import faults
from floodwall.drill._record import Recorder
from floodwall.drill.edge import LocalEdge
from floodwall.drill.scenario import FaultSpec, ServiceSpec, parse_scenario
from floodwall.drill.services import MockService, read_ledger
from stalls import StoodStill

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.xdist_group("drill"),  # real servers and real time: one drill at a time
]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
        yield client


async def started(tmp_path: Path, recorder: Recorder, **spec: Any) -> MockService:
    service = MockService(
        "svc", ServiceSpec.model_validate(spec), recorder=recorder, ledger=tmp_path / "l.jsonl"
    )
    await service.start()
    return service


async def test_reads_latency_and_errors(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    async def read(service: MockService) -> float:
        """Seconds a GET took, answered 200 by ``service``."""
        begun = time.monotonic()
        async with session.get(service.url + "/x", headers={"X-Drill-Request": "7"}) as answer:
            assert answer.status == 200
            assert (await answer.json())["service"] == "svc"
        return time.monotonic() - begun

    twin = await started(tmp_path, Recorder(), latency=0)
    try:
        answered = await read(twin)  # the same first read with no latency: the baseline
    finally:
        await twin.stop()
    recorder = Recorder()
    service = await started(tmp_path, recorder, latency="100ms")
    try:
        with StoodStill() as stood:
            took = await read(service)
        (call,) = recorder.calls()
        assert call.service == "svc" and call.request == 7 and call.status == 200
        assert call.end is not None and call.end - call.start >= 0.09
    finally:
        await service.stop()
    # the latency once, plus the twin's round trip and what this process stood still meanwhile
    bound = 1.2 * 0.1 + answered + stood.seconds
    print(f"\nlatency 100 ms: {took:.3f}s (bound {bound:.3f}s, twin {answered:.3f}s)")
    assert 0.09 <= took < bound, (took, answered, stood.seconds)
    failing = await started(tmp_path, Recorder(), latency=0, error_rate=1.0, error_status=502)
    try:
        async with session.get(failing.url + "/x") as answer:
            assert answer.status == 502
    finally:
        await failing.stop()


async def test_capacity_queue_then_refuse(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    service = await started(
        tmp_path, Recorder(), latency="300ms", capacity={"concurrency": 1, "queue": 1}
    )
    try:

        async def status() -> int:
            async with session.get(service.url + "/x") as answer:
                return answer.status

        first = asyncio.create_task(status())
        await asyncio.sleep(0.1)
        second = asyncio.create_task(status())  # waits in the queue
        await asyncio.sleep(0.1)
        assert service.waiting == 1
        assert await status() == 503  # no room: refused at once
        assert [await first, await second] == [200, 200]
    finally:
        await service.stop()


async def test_writes_and_the_ledger(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    recorder = Recorder()
    plain = MockService(
        "plain", ServiceSpec(latency=0), recorder=recorder, ledger=tmp_path / "plain.jsonl"
    )
    keyed = MockService(
        "keyed",
        ServiceSpec(latency=0, idempotent=True),
        recorder=recorder,
        ledger=tmp_path / "keyed.jsonl",
    )
    for service in (plain, keyed):
        await service.start()
    try:
        body = {"order": "o-1", "amount": 100}
        headers = {"Idempotency-Key": "o-1", "X-Drill-Request": "3"}
        replays = []
        for service in (plain, keyed, plain, keyed):
            async with session.post(service.url + "/pay", json=body, headers=headers) as answer:
                assert answer.status == 200
                replays.append(answer.headers.get("Idempotent-Replayed"))
        assert replays == [None, None, None, "true"]
    finally:
        for service in (plain, keyed):
            await service.stop()
    assert [w.order for w in read_ledger(tmp_path / "plain.jsonl", "plain")] == ["o-1", "o-1"]
    (write,) = read_ledger(tmp_path / "keyed.jsonl", "keyed")
    assert (write.order, write.key, write.request) == ("o-1", "o-1", 3)


async def test_faults_follow_their_schedule(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    recorder = Recorder()
    service = await started(tmp_path, recorder, latency=0)
    spec = FaultSpec.model_validate({"at": 0.3, "until": 0.8, "service": "svc", "error": 503})
    before, after = faults.service_faults(spec, 0, origin=recorder.origin, seed=1)
    service.add_faults(before, after)
    statuses = []
    try:
        for _ in range(10):
            async with session.get(service.url + "/x") as answer:
                statuses.append((round(recorder.now(), 2), answer.status))
            await asyncio.sleep(0.1)
    finally:
        await service.stop()
    for when, status in statuses:
        if 0.35 <= when <= 0.75:
            assert status == 503, statuses
        if when < 0.25 or when > 0.85:
            assert status == 200, statuses


async def test_hang_after_apply_applies_then_keeps_quiet(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    service = await started(tmp_path, recorder, latency=0)
    spec = FaultSpec.model_validate(
        {"at": 0, "service": "svc", "hang": {"duration": "2s", "after_apply": 1.0}}
    )
    service.add_faults(*faults.service_faults(spec, 0, origin=recorder.origin, seed=1))
    try:
        with pytest.raises(TimeoutError):
            async with session.post(
                service.url + "/pay",
                json={"order": "o-9"},
                timeout=aiohttp.ClientTimeout(total=0.3),
            ):
                pass
        await asyncio.sleep(0.05)
        assert [w.order for w in read_ledger(tmp_path / "l.jsonl", "svc")] == ["o-9"]
    finally:
        await service.stop()
    assert recorder.calls()[0].end is None  # cancelled at shutdown while still hanging


async def test_the_edge_pool_and_every_server_stops(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    scenario, modes = parse_scenario(
        {
            "services": {"slow": {"latency": "400ms"}},
            "edge": {"workers": 1, "queue": 1, "routes": [{"path": "/s", "calls": ["slow"]}]},
            "load": {"duration": 1, "rate": 1},
        }
    )
    recorder = Recorder()
    service = MockService(
        "slow", scenario.services["slow"], recorder=recorder, ledger=tmp_path / "s.jsonl"
    )
    await service.start()
    edge = LocalEdge(
        scenario.edge,
        urls={"slow": service.url},
        document=None,
        client=modes[0].client,
        recorder=recorder,
    )
    url = await edge.start()

    async def status() -> int:
        async with session.get(url + "/s") as answer:
            return answer.status

    try:
        tasks = [asyncio.create_task(status()) for _ in range(2)]
        await asyncio.sleep(0.1)
        assert (edge.pool.busy, edge.pool.queued) == (1, 1)
        assert await status() == 503  # every worker busy, the queue full
        assert await asyncio.gather(*tasks) == [200, 200]
    finally:
        await edge.stop()
        await service.stop()
    for address in (url, service.url):
        with pytest.raises(aiohttp.ClientConnectionError):
            async with session.get(address + "/s"):
                pass
