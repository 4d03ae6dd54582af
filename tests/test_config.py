# mypy: disable-error-code="comparison-overlap,unreachable"
# (tests read a property before and after acting; mypy assumes it cannot change)
"""Configuration: units, schema, inheritance, level rules, errors, the live registry."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import floodwall as fw
from floodwall import CircuitState, FakeClock
from floodwall.backoff import EqualJitter, Exponential, Fixed, FullJitter, NoBackoff
from floodwall.config import (
    Registry,
    build_backoff,
    load,
    loads,
    parse,
    parse_duration,
    parse_rate,
)
from floodwall.config import parse_rate as config_parse_rate
from floodwall.config.schema import BackoffConfig, CircuitBreakerConfig
from floodwall.ratelimit import Rate
from floodwall.ratelimit import parse_rate as ratelimit_parse_rate

DOC = """
defaults:
  timeout: 2s
  retry:
    attempts: 3
    backoff: {kind: exponential, base: 100ms, cap: 2s, jitter: full}
    budget: {ratio: 0.1}
  circuit_breaker: {failure_rate: 0.5, minimum_calls: 20, window: 10s, open_duration: 5s}
resources:
  payments:
    level: 1
    timeout: 5s
    retry: {attempts: 1}
  reviews:
    level: 3
    fallback: {value: []}
  search:
    retry: false
stores:
  default: memory://
"""


def write(tmp_path: Path, text: str, name: str = "floodwall.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("5s", 5.0), ("1.5s", 1.5), ("2m", 120.0), ("1h", 3600.0), (3, 3.0)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "rate", "period"),
    [
        ("100/s", 100.0, 1.0),
        ("10/min", 1 / 6, 60.0),
        ("5/h", 5 / 3600, 3600.0),
        ("1000/15m", 10 / 9, 900.0),
    ],
)
def test_rates(text: str, rate: float, period: float) -> None:
    parsed = parse_rate(text)
    assert parsed.per_second == pytest.approx(rate)
    assert parsed.period == period  # the stated window is kept: "5/h" is not 1 per 12 minutes


def test_one_rate_grammar_and_type() -> None:
    """Config and the limiters read a rate with one parser: "5/h" means the same everywhere."""
    assert config_parse_rate("5/h") == Rate(5, 3600.0)
    for text in ("5/h", "10/s", "1/30s", "0.5/s", "3 per minute", 2.5):
        assert config_parse_rate(text) == ratelimit_parse_rate(text)
    with pytest.raises(ValueError, match=r"^resources\.api\.rate_limit\.rate must look like"):
        config_parse_rate("fast", "resources.api.rate_limit.rate")


@pytest.mark.parametrize("bad", ["5 parsecs", "fast", -1, True, "1/0s", "0/s"])
def test_bad_units_echo_the_value(bad: object) -> None:
    parser: Callable[[Any], object] = (
        parse_rate if isinstance(bad, str) and "/" in bad else parse_duration
    )
    with pytest.raises(ValueError, match=re.escape(f"got {bad!r}")):
        parser(bad)


def test_inheritance_and_level_rules(tmp_path: Path) -> None:
    doc = load(write(tmp_path, DOC))
    pay, rev, search = (doc.resources[n] for n in ("payments", "reviews", "search"))
    assert pay.timeout is not None
    assert pay.timeout.seconds == 5.0  # own key wins
    assert pay.retry is not None
    assert pay.retry.attempts == 1
    assert pay.retry.backoff.cap == 2.0  # the rest of the section is inherited
    assert pay.circuit_breaker is not None
    assert pay.circuit_breaker.minimum_calls == 40  # level 1: break only on clear evidence
    assert rev.retry is not None
    assert rev.retry.attempts == 1  # level 3 never retries
    assert rev.circuit_breaker is not None
    assert rev.circuit_breaker.failure_rate == 0.3  # and breaks earlier
    assert rev.timeout is not None
    assert rev.timeout.seconds == 2.0
    assert search.retry is None  # `false` switches an inherited policy off
    assert doc.stores == {"default": "memory://"}


def test_level_rules_bound_the_users_defaults_without_undoing_them() -> None:
    doc = parse(
        {
            "defaults": {
                "retry": {"attempts": 4},
                "circuit_breaker": {"minimum_calls": 5, "failure_rate": 0.9},
            },
            "resources": {
                "optional": {"level": 3},
                "critical": {"level": 1},
                "own": {"level": 1, "circuit_breaker": {"minimum_calls": 20}},
                "off": {"level": 3, "circuit_breaker": {"failure_rate": None, "error_count": 3}},
            },
        }
    )
    optional, critical, own, off = (
        doc.resources[n] for n in ("optional", "critical", "own", "off")
    )
    assert optional.circuit_breaker is not None
    assert optional.circuit_breaker.minimum_calls == 5  # already earlier than level 3's 10
    assert optional.circuit_breaker.failure_rate == 0.3  # 0.9 is later: lowered to the bound
    assert optional.retry is not None
    assert optional.retry.attempts == 1
    assert critical.circuit_breaker is not None
    assert critical.circuit_breaker.minimum_calls == 40  # level 1 asks for more evidence
    assert critical.circuit_breaker.failure_rate == 0.9  # already past 0.6: kept
    assert own.circuit_breaker is not None
    assert own.circuit_breaker.minimum_calls == 20  # the resource's own key beats the rule
    assert off.circuit_breaker is not None
    assert off.circuit_breaker.failure_rate is None  # an explicit null stays off
    bare = parse({"resources": {"r": {"level": 3, "circuit_breaker": {}}}}).resources["r"]
    assert bare.circuit_breaker is not None
    assert bare.circuit_breaker.minimum_calls == 10  # unset: the rule's value


def test_toml_and_json_documents(tmp_path: Path) -> None:
    toml = write(
        tmp_path,
        """
        [resources.payments]
        level = 1
        timeout = "750ms"
        [resources.payments.circuit_breaker]
        window_calls = 50
        """,
        "floodwall.toml",
    )
    doc = load(toml)
    assert doc.resources["payments"].timeout is not None
    assert doc.resources["payments"].timeout.seconds == 0.75
    as_json = write(tmp_path, '{"resources": {"a": {"timeout": 1}}}', "floodwall.json")
    assert load(as_json).resources["a"].timeout is not None


def test_errors_name_file_path_and_value(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        resources:
          payments:
            retry: {attempts: 0, backof: {}}
            timeout: 5 parsecs
            circuit_breaker: {failure_rate: 1.5}
            level: 4
        """,
    )
    with pytest.raises(fw.ConfigError) as info:
        load(path)
    text = str(info.value)
    assert f"{path}: resources.payments.retry.attempts: " in text
    assert "retry.attempts: must be an integer >= 1, got 0" in text
    assert "resources.payments.retry.backof: Extra inputs are not permitted" in text
    assert "got '5 parsecs'" in text
    assert "resources.payments.circuit_breaker.failure_rate" in text
    assert "failure_rate: must be a number in (0, 1], got 1.5" in text
    assert "resources.payments.level" in text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "the document must be a mapping, got list"),
        ("resources: [a]", "resources: must be a mapping"),
        ("resources: {a: 3}", "resources.a: must be a mapping, got 3"),
        ("a: [", "not a valid document"),
        ("defaults: {timeout: -1s}", "defaults.timeout"),
    ],
)
def test_document_shape_errors(text: str, message: str) -> None:
    with pytest.raises(fw.ConfigError, match=message.replace("[", r"\[")):
        parse(loads(text, "x.yaml"), "x.yaml")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(fw.ConfigError, match="cannot read the file"):
        load(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("section", "kind"),
    [
        ({"kind": "none"}, NoBackoff),
        ({"kind": "fixed", "base": "1s"}, Fixed),
        ({"kind": "exponential", "jitter": "none"}, Exponential),
        ({"kind": "exponential", "jitter": "full"}, FullJitter),
        ({"kind": "exponential", "jitter": "equal"}, EqualJitter),
    ],
)
def test_backoff_sections(section: dict[str, Any], kind: type) -> None:
    assert isinstance(build_backoff(BackoffConfig.model_validate(section)), kind)


def test_every_policy_round_trips_through_yaml(tmp_path: Path, clock: FakeClock) -> None:
    """What a document says is what the built policies do."""
    registry = Registry(load(write(tmp_path, DOC)), clock=clock)
    pay = registry.get("payments")
    assert pay.breaker is not None
    assert pay.breaker.options.minimum_calls == 40
    assert pay.breaker.options.open_duration == 5.0
    assert pay.retry is not None
    assert pay.retry.attempts == 1
    assert pay.timeout is not None
    assert pay.timeout.seconds == 5.0
    assert [p.kind for p in pay.policies] == ["circuit_breaker", "retry", "timeout"]
    reviews = registry.get("reviews")
    assert [p.kind for p in reviews.policies] == ["fallback", "circuit_breaker", "retry", "timeout"]
    assert reviews.call(lambda: 1 / 0) == []
    assert registry.names() == ["payments", "reviews", "search"]
    with pytest.raises(KeyError, match="no resource named 'nope'"):
        registry.get("nope")


def test_registry_decorates_and_follows_reloads(clock: FakeClock) -> None:
    registry = Registry({"resources": {"a": {"fallback": {"value": "old"}}}}, clock=clock)

    @registry("a")
    def work() -> str:
        raise ConnectionError

    assert work() == "old"
    registry.reload({"resources": {"a": {"fallback": {"value": "new"}}}})
    assert work() == "new"  # the decorated function follows the reload


def test_reload_keeps_breaker_state_and_window(clock: FakeClock) -> None:
    doc = {"resources": {"a": {"circuit_breaker": {"minimum_calls": 5}}}}
    registry = Registry(doc, clock=clock)
    breaker = registry.get("a").breaker
    assert breaker is not None
    for _ in range(5):
        with pytest.raises(ConnectionError):
            registry.get("a").call(_fail)
    assert breaker.state is CircuitState.OPEN
    registry.reload({"resources": {"a": {"circuit_breaker": {"minimum_calls": 7}}}})
    assert registry.get("a").breaker is breaker  # the same object, reconfigured
    assert breaker.state is CircuitState.OPEN
    assert breaker.options.minimum_calls == 7


def test_invalid_reload_keeps_the_last_good_config(clock: FakeClock) -> None:
    events: list[fw.Event] = []
    registry = Registry(
        {"resources": {"a": {"timeout": "1s"}}}, clock=clock, listeners=[events.append]
    )
    with pytest.raises(fw.ConfigError, match=r"resources\.a\.timeout"):
        registry.reload({"resources": {"a": {"timeout": "soon"}}}, source="bad.yaml")
    resource = registry.get("a")
    assert resource.timeout is not None
    assert resource.timeout.seconds == 1.0
    assert events[-1].kind == "config_rejected"
    assert "bad.yaml" in events[-1].reason


def test_removed_resources_drain(clock: FakeClock) -> None:
    registry = Registry({"resources": {"a": {}, "b": {}}}, clock=clock)
    held = registry.get("b")
    registry.reload({"resources": {"a": {}}})
    assert registry.names() == ["a"]
    assert held.removed
    assert held.call(lambda: "still served") == "still served"


def test_operator_overrides_expire(clock: FakeClock) -> None:
    registry = Registry(
        {"resources": {"pay": {"circuit_breaker": {}}, "rec": {"level": 3}}}, clock=clock
    )
    registry.force_open("pay", ttl=60)
    breaker = registry.get("pay").breaker
    assert breaker is not None
    assert breaker.state is CircuitState.FORCED_OPEN
    with pytest.raises(fw.CircuitOpenError):
        registry.get("pay").call(lambda: 1)
    registry.shed(3, ttl=30)
    with pytest.raises(fw.DegradedError, match="level 3 is shed"):
        registry.get("rec").call(lambda: 1)
    assert [(o.target, o.action) for o in registry.overrides()] == [
        ("level:3", "shed"),
        ("pay", "force_open"),
    ]
    clock.advance(30)
    assert registry.get("rec").call(lambda: "back") == "back"
    assert breaker.state is CircuitState.FORCED_OPEN
    clock.advance(30)
    assert registry.overrides() == []
    assert breaker.state is CircuitState.CLOSED
    with pytest.raises(fw.ConfigError, match="level 1 is never shed"):
        registry.shed(1)
    with pytest.raises(fw.ConfigError, match="has no circuit_breaker"):
        registry.force_closed("rec")


def test_snapshot_shows_live_state(clock: FakeClock) -> None:
    registry = Registry(
        {"resources": {"a": {"circuit_breaker": {"minimum_calls": 1}}}}, clock=clock
    )
    with pytest.raises(ConnectionError):
        registry.get("a").call(_fail)
    snap = registry.snapshot()
    assert snap["a"]["circuit_breaker"]["state"] == "OPEN"
    assert snap["a"]["level"] == 2


def _fail() -> None:
    raise ConnectionError


def test_check_config_command(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from floodwall.cli import app

    good = write(tmp_path, DOC)
    result = CliRunner().invoke(app, ["check-config", str(good)])
    assert result.exit_code == 0, result.output
    assert "valid:" in result.output
    assert "backoff.kind=exponential" in result.output
    assert "minimum_calls=40" in result.output  # level 1's effective value, not the default
    bad = write(tmp_path, "resources: {a: {retry: {attempts: 0}}}", "bad.yaml")
    result = CliRunner().invoke(app, ["check-config", str(bad)])
    assert result.exit_code == 1
    assert "resources.a.retry.attempts" in result.output


def test_cache_sampled_drop_and_shed_answers_from_cache(clock: FakeClock) -> None:
    doc = {
        "resources": {
            "recs": {
                "level": 3,
                "sampled_drop": {"ratio": 0.0},
                "cache": {"ttl": "10s", "stale_ttl": "1h"},
            }
        }
    }
    registry = Registry(doc, clock=clock)
    recs = registry.get("recs")
    assert [p.kind for p in recs.policies][:2] == ["sampled_drop", "cache"]
    assert recs.call(lambda user: [f"for {user}"], "ann") == ["for ann"]  # cached
    registry.shed(3)
    # Shed: the dependency is skipped, the cache answers with the last good value.
    assert recs.call(lambda user: ["fresh"], "ann") == ["for ann"]
    with pytest.raises(fw.DegradedError):
        recs.call(lambda user: ["fresh"], "bob")  # nothing cached for bob
    registry.clear("level:3")
    sampled = recs.sampled
    assert sampled is not None
    registry.reload(
        {"resources": {"recs": {**doc["resources"]["recs"], "sampled_drop": {"ratio": 1}}}}
    )
    assert registry.get("recs").sampled is sampled  # tuned live, same policy
    assert sampled.ratio == 1.0


async def test_shed_async_path_answers_from_fallback(clock: FakeClock) -> None:
    registry = Registry(
        {"resources": {"gifts": {"level": 3, "fallback": {"value": ["rose"]}}}}, clock=clock
    )
    registry.shed(3)

    async def fetch() -> list[str]:
        raise AssertionError("a shed dependency is never called")

    assert await registry.get("gifts").call_async(fetch) == ["rose"]


def test_cache_store_must_be_named(clock: FakeClock) -> None:
    with pytest.raises(fw.ConfigError, match="no store named 'shared'"):
        Registry({"resources": {"a": {"cache": {"store": "shared"}}}}, clock=clock)
    registry = Registry(
        {"resources": {"a": {"cache": {"store": "shared"}}}, "stores": {"shared": "memory://"}},
        clock=clock,
    )
    assert registry.get("a").cache is not None


def test_set_limit_override_expires_and_survives_reload(clock: FakeClock) -> None:
    doc = {"resources": {"api": {"rate_limit": {"rate": "2/s", "burst": 0}}}}
    registry = Registry(doc, clock=clock)
    api = registry.get("api")
    api.call(int)
    with pytest.raises(fw.RateLimitedError):
        api.call(int)
    registry.set_limit("api", "100/s", ttl=60, reason="partner raised our quota")
    for _ in range(50):
        api.call(int)
    registry.reload(doc)  # a reload keeps the operator's limit
    for _ in range(20):
        api.call(int)
    assert [(o.action, o.reason) for o in registry.overrides()] == [
        ("set_limit", "partner raised our quota")
    ]
    clock.advance(60)
    assert registry.overrides() == []
    api.call(int)
    with pytest.raises(fw.RateLimitedError):
        api.call(int)  # back to 2/s
    with pytest.raises(fw.ConfigError, match="no rate_limit"):
        Registry({"resources": {"x": {}}}, clock=clock).set_limit("x", "1/s")


def test_adaptive_and_idempotency_sections(clock: FakeClock) -> None:
    doc = {
        "resources": {
            "search": {
                "adaptive": {"algorithm": "aimd", "options": {"initial_limit": 5, "min_limit": 1}}
            },
            "pay": {"idempotency": {"ttl": "1h"}, "retry": {"attempts": 3, "idempotent": False}},
        }
    }
    registry = Registry(doc, clock=clock)
    search = registry.get("search")
    assert search.adaptive is not None
    assert search.adaptive.limit == 5
    assert search.call(lambda: "ok") == "ok"
    assert registry.snapshot()["search"]["adaptive"]["inflight"] == 0
    pay = registry.get("pay")
    assert [p.kind for p in pay.policies] == ["idempotency", "retry"]
    runs: list[int] = []

    def charge() -> int:
        runs.append(1)
        return len(runs)

    with fw.idempotency_key("order-1"):
        assert pay.call(charge) == 1
        assert pay.call(charge) == 1  # answered from the record, not run again
    assert runs == [1]
    refused = r"resources\.search\.adaptive: options for aimd .*got \['nope'\]"
    with pytest.raises(fw.ConfigError, match=refused):
        registry.reload(
            {"resources": {"search": {"adaptive": {"algorithm": "aimd", "options": {"nope": 1}}}}}
        )


@pytest.mark.parametrize("value", [True, "20", b"20", bytearray(b"20")])
def test_a_count_is_a_number_not_a_flag_string_or_bytes(value: object) -> None:
    """Pydantic's lax mode would read each of these as a count (``b"20"`` as 20): refused,
    naming the field and the value (found by the bad-input walk drawing ``b'1'``)."""
    with pytest.raises(ValidationError, match="minimum_calls must be a number, got"):
        CircuitBreakerConfig(minimum_calls=value)
