"""The simulator's machinery: events, clock, distributions, server, metrics, scenario files."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from floodwall import ConfigError
from floodwall.adaptive import AdaptiveLimiter, FixedLimit
from floodwall.drill.metrics import percentile
from floodwall.sim import (
    Constant,
    Distribution,
    Exponential,
    Hang,
    Job,
    LimiterGuard,
    LogNormal,
    Recorder,
    Server,
    Simulation,
    Uniform,
    distribution,
    format_report,
    run_scenario,
)
from floodwall.sim.cli import simulate
from floodwall.sim.library import grpc_example


def test_events_run_in_time_then_schedule_order() -> None:
    sim = Simulation()
    seen: list[tuple[float, str]] = []
    sim.at(2.0, lambda tag: seen.append((sim.now, tag)), "b")
    sim.at(1.0, lambda tag: seen.append((sim.now, tag)), "a")
    sim.at(2.0, lambda tag: seen.append((sim.now, tag)), "c")
    sim.after(0.5, lambda tag: sim.after(0.1, lambda t: seen.append((sim.now, t)), "d"), None)
    sim.run(until=1.5)
    assert seen == [(0.6, "d"), (1.0, "a")]
    assert sim.now == 1.5
    sim.run(until=10)
    assert [tag for _, tag in seen] == ["d", "a", "b", "c"]
    assert sim.events == 5


def test_sim_clock_refuses_to_block() -> None:
    clock = Simulation().clock
    with pytest.raises(RuntimeError, match="cannot block"):
        clock.sleep(1)
    assert clock.monotonic() == 0.0


def test_distributions_and_their_means() -> None:
    rng = random.Random(0)
    cases: list[tuple[Distribution, float]] = [
        (Constant(0.5), 0.5),
        (Exponential(0.02), 0.02),
        (Uniform(0.01, 0.03), 0.02),
        (LogNormal(0.02, 1.0), 0.02),
        (Hang(Constant(0.05), 0.05, 8.0), 0.4475),
    ]
    for dist, mean in cases:
        draws = [dist.sample(rng) for _ in range(20000)]
        assert sum(draws) / len(draws) == pytest.approx(mean, rel=0.1)
        assert dist.mean == pytest.approx(mean)


def test_distribution_specs() -> None:
    assert distribution(0.5) == Constant(0.5)
    assert distribution({"exponential": 0.1}) == Exponential(0.1)
    assert distribution({"lognormal": {"mean": 0.02}}) == LogNormal(0.02, 1.0)
    assert distribution({"hang": {"base": 0.05, "probability": 0.1, "duration": 2}}) == Hang(
        Constant(0.05), 0.1, 2.0
    )
    with pytest.raises(ConfigError, match=r"load.service_time: unknown distribution 'pareto'"):
        distribution({"pareto": {}}, "load.service_time")
    with pytest.raises(ConfigError, match=r"x.uniform: missing 'high'"):
        distribution({"uniform": {"low": 1}}, "x")
    with pytest.raises(ConfigError, match="expected seconds or a one-key mapping"):
        distribution("fast")


def test_server_queues_answers_and_guards() -> None:
    sim = Simulation()
    recorder = Recorder()
    limiter = AdaptiveLimiter(FixedLimit(3), clock=sim.clock)
    server = Server(sim, 1, recorder, guard=LimiterGuard(limiter), queue_limit=1)
    answers: list[tuple[float, str]] = []

    def respond(job: Job, outcome: str) -> None:
        answers.append((sim.now, outcome))

    for _ in range(4):
        server.submit(Job(arrival=0.0, deadline=math.inf, work=1.0, respond=respond))
    sim.run(10)
    # 1 works, 1 queues, the queue-limit refuses the 3rd, the limiter (3) refuses the 4th
    assert answers == [(0.0, "rejected"), (0.0, "rejected"), (1.0, "ok"), (2.0, "ok")]
    assert limiter.inflight == 0
    assert recorder.busy[0] == 1


def test_percentile_and_summary() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
    assert percentile(list(range(1, 101)), 0.99) == 99
    recorder = Recorder()
    recorder.offered(0.5)
    recorder.outcome(0.7, "ok", 0.2)
    recorder.outcome(1.5, "timeout", 1.0)
    summary = recorder.summary(0.0, 2.0)
    assert (summary.offered, summary.ok, summary.timeout) == (1, 1, 1)
    assert summary.success_rate == 0.5
    assert summary.goodput == 0.5
    assert recorder.series("ok", 2.0) == [1.0, 0.0]
    idle = recorder.summary(2.0, 3.0)  # no answers: the latency figures are NaN, as goodput's
    assert math.isnan(idle.p50) and math.isnan(idle.p99)


def test_runs_are_deterministic() -> None:
    spec = grpc_example(phase=10.0, warmup=0.0)
    first, second = run_scenario(spec), run_scenario(spec)
    assert first.events == second.events
    assert first.recorder.good == second.recorder.good
    different = run_scenario({**spec, "seed": 2})
    assert different.recorder.good != first.recorder.good


def test_scenario_files_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(grpc_example(phase=5.0, warmup=1.0)))
    simulate(str(path))
    out = capsys.readouterr().out
    assert "scenario grpc-example" in out
    assert "goodput/s" in out and "2x" in out
    import yaml

    yaml_path = tmp_path / "scenario.yaml"
    yaml_path.write_text(yaml.safe_dump(grpc_example(phase=5.0)))
    assert "0.5x" in format_report(run_scenario(yaml_path))


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"guard": {"type": "magic"}}, "guard.type: unknown guard 'magic'"),
        ({"guard": {"algorithm": "bogus"}}, "guard.algorithm: unknown algorithm 'bogus'"),
        ({"guard": {"algorithm": "aimd", "options": {"nope": 1}}}, "guard.options"),
        ({"load": {"type": "open", "phases": []}}, "load.phases: expected a non-empty list"),
        ({"load": {"type": "open", "phases": [{"rate": 1}]}}, r"load.phases\[0\]: missing"),
        ({"load": {"type": "teleport"}}, "load.type: unknown load 'teleport'"),
        ({"server": "big"}, "server: expected a mapping"),
    ],
)
def test_scenario_errors_name_their_path(patch: dict[str, object], message: str) -> None:
    spec = {**grpc_example(phase=1.0), **patch}
    with pytest.raises(ConfigError, match=message):
        run_scenario(spec)


def test_every_guard_kind_runs() -> None:
    base = grpc_example(phase=5.0, warmup=0.0)
    guards = [
        {"type": "limiter", "algorithm": name, "windowed": name != "aimd"}
        for name in ("aimd", "vegas", "gradient", "gradient2", "fixed")
    ] + [
        {"type": "limiter", "algorithm": "gradient2", "partitions": {"a": 0.5}},
        {"type": "bbr", "options": {"window": 5.0, "buckets": 50}},
        {"type": "dagor"},
        {"type": "shedder", "max_queue_time": 0.1, "at": "start"},
        {"type": "shedder", "limiter": {"type": "limiter", "algorithm": "aimd"}},
        {"type": "shedder", "limiter": {"type": "dagor"}, "max_queue_time": 0.5},
    ]
    for guard in guards:
        result = run_scenario({**base, "guard": guard})
        assert result.overall().ok > 0, guard
