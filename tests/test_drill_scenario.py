"""Drill scenarios: the schema, errors that name their path, the examples and the demo's."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

import floodwall as fw
from floodwall.chaos import Latency
from floodwall.config import load as load_config
from floodwall.drill.demo import payments, product_page
from floodwall.drill.scenario import (
    check_expectation,
    load_scenario,
    parse_latency,
    parse_scenario,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "drills"


def minimal() -> dict[str, Any]:
    return {
        "name": "mini",
        "services": {"a": {"latency": "10ms"}, "b": {}},
        "edge": {"routes": [{"path": "/a", "calls": ["a"]}, {"path": "/b", "calls": ["b"]}]},
        "load": {"duration": "5s", "rate": 20},
        "faults": [{"at": "1s", "until": "3s", "service": "b", "latency": "1s"}],
    }


def error_of(raw: dict[str, Any]) -> str:
    with pytest.raises(fw.ConfigError) as caught:
        parse_scenario(raw, "drill.yaml")
    return str(caught.value)


def test_a_minimal_scenario_has_one_unprotected_mode() -> None:
    scenario, modes = parse_scenario(minimal())
    assert [m.name for m in modes] == ["unprotected"]
    assert modes[0].document is None
    assert scenario.edge.workers == 100 and scenario.edge.queue == 200
    assert scenario.load.timeout == 2.0
    assert scenario.faults[0].what == "latency +1s"
    assert scenario.faulty_services() == {"b"}


def test_modes_with_inline_and_file_configs(tmp_path: Path) -> None:
    (tmp_path / "guard.yaml").write_text("resources:\n  b: {timeout: 100ms}\n")
    raw = minimal()
    raw["modes"] = {
        "unprotected": {"config": None, "client": {"timeout": "1s", "retries": 2}},
        "inline": {"config": {"resources": {"a": {"timeout": "50ms"}}}},
        "file": {"config": "guard.yaml"},
    }
    (tmp_path / "drill.yaml").write_text(yaml.safe_dump(raw))
    _, modes = load_scenario(tmp_path / "drill.yaml")
    by_name = {m.name: m for m in modes}
    assert by_name["unprotected"].client.retries == 2
    inline = by_name["inline"].document
    assert inline is not None and inline.resources["a"].timeout is not None
    file_doc = by_name["file"].document
    assert file_doc is not None and file_doc.resources["b"].timeout is not None
    assert by_name["file"].client.retries == 0  # the edge's default client


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda r: r["edge"]["routes"][0].update(calls=["nope"]),
            "drill.yaml: edge.routes[0].calls: no service named 'nope' (known: a, b)",
        ),
        (
            lambda r: r["faults"][0].update(service="c"),
            "faults[0].service: no service named 'c'",
        ),
        (
            lambda r: r["faults"][0].update(until="1s"),
            "drill.yaml: faults[0]: until (1s) must be after at (1s)",
        ),
        (
            lambda r: r["faults"][0].update(at="9s", until=None),
            "faults[0].at: 9s is not within the load",
        ),
        (lambda r: r["faults"][0].update(error=503), "give exactly one of latency, error"),
        (lambda r: r["faults"][0].pop("service"), "a latency fault needs `service`"),
        (
            lambda r: r["services"]["a"].update(latency={"gauss": {}}),
            "services.a.latency: unknown distribution 'gauss'",
        ),
        (
            lambda r: r["services"]["a"].update(latency={"lognormal": {"sigma": 1}}),
            "services.a.latency: lognormal: missing parameter 'median'",
        ),
        (lambda r: r["services"]["a"].update(colour="red"), "services.a.colour: Extra inputs"),
        (lambda r: r["load"].pop("rate"), "load: give exactly one of rate, ramp, spike"),
        (lambda r: r["load"].update(mix={"/c": 1}), "load.mix: no route '/c'"),
        (lambda r: r["load"].update(duration="soon"), "load.duration: expected a duration"),
        (lambda r: r.update(config={}, modes={"x": {}}), "either `config` (one mode) or `modes`"),
        (
            lambda r: r.update(expect={"protected": {"speed": ">= 1"}}),
            "expect.protected: no mode named 'protected' (modes: unprotected)",
        ),
        (
            lambda r: r.update(expect={"unprotected": {"speed": ">= 1"}}),
            "expect.unprotected.speed: unknown figure",
        ),
        (
            lambda r: r.update(expect={"unprotected": {"lost_writes": "fine"}}),
            "expect.unprotected.lost_writes: expected a check",
        ),
        (
            lambda r: r["edge"].update(kind="external"),
            "an external edge needs `url`",
        ),
        (
            lambda r: r["edge"]["routes"].append({"path": "/a", "calls": ["a"]}),
            "routes[2]: GET /a is listed twice",
        ),
        (
            lambda r: r.update(config={"resources": {"c": {"timeout": "1s"}}}),
            "drill.yaml: config.resources.c: no route calls a dependency named 'c'",
        ),
        (
            lambda r: r.update(config={"resources": {"a": {"timeout": "-1s"}}}),
            "drill.yaml: config: resources.a.timeout",
        ),
    ],
)
def test_errors_name_their_path(change: Any, message: str) -> None:
    raw = copy.deepcopy(minimal())
    change(raw)
    assert message in error_of(raw)


def test_a_config_file_that_is_missing(tmp_path: Path) -> None:
    raw = minimal()
    raw["config"] = "missing.yaml"
    with pytest.raises(fw.ConfigError, match="config: cannot read"):
        parse_scenario(raw, "drill.yaml", tmp_path)


def test_latency_forms() -> None:
    assert parse_latency("50ms") == Latency.fixed(0.05)
    assert parse_latency(0.2) == Latency.fixed(0.2)
    assert parse_latency({"fixed": "1s"}) == Latency.fixed(1.0)
    assert parse_latency({"uniform": {"low": "10ms", "high": "20ms"}}) == Latency.uniform(
        0.01, 0.02
    )
    assert parse_latency({"exponential": {"mean": "5ms", "cap": "1s"}}) == Latency.exponential(
        0.005, cap=1.0
    )
    assert parse_latency({"lognormal": {"median": "50ms", "sigma": 0.3}}) == Latency.lognormal(
        0.05, 0.3
    )
    with pytest.raises(ValueError, match="expected a duration or one of"):
        parse_latency({"fixed": 1, "uniform": 2})


def test_profiles() -> None:
    raw = minimal()
    raw["load"] = {"duration": 10, "ramp": {"from": 10, "to": "30/s"}}
    scenario, _ = parse_scenario(raw)
    assert [scenario.load.rate_at(t) for t in (0, 5, 10)] == [10, 20, 30]
    assert scenario.load.peak_rate == 30
    raw["load"] = {"duration": 10, "spike": {"base": 5, "peak": 50, "at": "4s", "for": "2s"}}
    scenario, _ = parse_scenario(raw)
    assert [scenario.load.rate_at(t) for t in (3.9, 4, 5.9, 6)] == [5, 50, 50, 5]


def test_hang_and_error_shorthands() -> None:
    raw = minimal()
    raw["faults"] = [
        {"at": 1, "service": "a", "error": True, "rate": 0.3},
        {"at": 1, "service": "b", "hang": True},
    ]
    scenario, _ = parse_scenario(raw)
    assert scenario.faults[0].error == 503
    assert scenario.faults[0].what == "30% of calls: answers 503"
    assert scenario.faults[1].what == "hangs 30s"


@pytest.mark.parametrize(
    ("figure", "check", "ok"),
    [
        (0.995, ">= 0.99", True),
        (0.98, ">= 0.99", False),
        (0, "== 0", True),
        (1.5, "<= 2", True),
        (None, "<= 2", False),
        (None, "== null", True),
        (math.nan, ">= 0", False),
        (3, "< 3", False),
        (3, "> 2.5", True),
    ],
)
def test_expectations(figure: float | None, check: str, ok: bool) -> None:
    assert check_expectation(figure, check) is ok


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    if path.name.endswith(".floodwall.yaml"):
        load_config(path)
        return
    scenario, modes = load_scenario(path)
    assert scenario.faults
    assert len(modes) >= 1


@pytest.mark.parametrize("quick", [False, True])
def test_demo_scenarios_are_valid(quick: bool) -> None:
    for build in (product_page, payments):
        scenario, modes = parse_scenario(build(quick))
        assert [m.name for m in modes] == ["unprotected", "protected"]
        assert modes[0].document is None and modes[1].document is not None
        assert scenario.faults[0].until is not None
        assert scenario.faults[0].until < scenario.load.duration


def test_the_long_demo_matches_its_example_files() -> None:
    for build, name in ((product_page, "product_page"), (payments, "payments")):
        demo, demo_modes = parse_scenario(build(False))
        example, example_modes = load_scenario(EXAMPLES / f"{name}.yaml")
        assert demo.services == example.services
        assert demo.edge == example.edge
        assert demo.load == example.load
        assert demo.faults == example.faults
        for ours, theirs in zip(demo_modes, example_modes, strict=True):
            assert ours.document == theirs.document
            assert ours.client == theirs.client
