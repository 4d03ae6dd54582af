"""The Django integration under Django's own test client (issue 21): a real project
(``tests/djangoapp``) with ``floodwall.django`` in ``INSTALLED_APPS`` and its middleware.

An overload and a dependency outage behave as with FastAPI: 429 and 503 answered as
problem+json with ``Retry-After``, a fallback answering with ``X-Degraded``, the breaker and the
guard's decisions on ``/metrics``. The same project under gunicorn and uvicorn is in
``tests/integration/test_django_servers.py``.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest

_SET = "DJANGO_SETTINGS_MODULE" not in os.environ
if _SET:
    os.environ["DJANGO_SETTINGS_MODULE"] = "djangoapp.settings"
django.setup()
if _SET:  # read once by setup(): keep it out of the servers other tests start
    del os.environ["DJANGO_SETTINGS_MODULE"]

from django.core import checks  # noqa: E402 - after django.setup()
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.management.base import CommandError  # noqa: E402
from django.test import AsyncClient, Client, override_settings  # noqa: E402

import floodwall as fw  # noqa: E402
import floodwall.django  # noqa: E402
from djangoapp import views  # noqa: E402
from servers import RestartableRedis  # noqa: E402


@pytest.fixture
def down(tmp_path: Path) -> Iterator[Path]:
    """The dependencies' switch (exists: down), and a fresh registry and guard for the test."""
    switch = tmp_path / "down"
    with override_settings(DOWN=switch, FLOODWALL_GUARD=_guard_settings()):
        yield switch


def _guard_settings(**extra: Any) -> dict[str, Any]:
    from django.conf import settings

    return {**settings.FLOODWALL_GUARD, **extra}


def test_django_a_view_runs_under_the_request_deadline_and_retry_marker(down: Path) -> None:
    answer = Client().get("/hello", headers={"X-Request-Deadline": "1500", "X-Retry-Attempt": "2"})
    assert answer.status_code == 200
    body = answer.json()
    assert body["attempt"] == 2 and body["retry"] is True
    assert 1.0 < body["remaining"] <= 1.5


def test_django_an_overload_is_answered_429_with_a_problem(down: Path) -> None:
    client = Client(REMOTE_ADDR="203.0.113.9")
    answers = [client.get("/limited") for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 5 + [429]
    refused = answers[-1]
    assert refused["Content-Type"] == "application/problem+json"
    assert int(refused["Retry-After"]) >= 1
    assert refused["RateLimit-Limit"] == "5"
    problem = refused.json()
    assert (problem["status"], problem["kind"]) == (429, "rate_limited")
    assert Client(REMOTE_ADDR="203.0.113.10").get("/limited").status_code == 200  # per IP


def test_django_a_dependency_outage_degrades_and_then_answers_503(down: Path) -> None:
    client = Client(raise_request_exception=False)
    assert client.get("/reviews").json() == {"reviews": ["reviews answered"]}
    down.touch()
    fallback = [client.get("/reviews") for _ in range(3)]
    assert all(a.status_code == 200 and a.json() == {"reviews": []} for a in fallback)
    assert fallback[0]["X-Degraded"].startswith("reviews")
    assert "reason=circuit_open" in fallback[-1]["X-Degraded"]  # the breaker opened after 2
    failures = [client.get("/payments") for _ in range(2)]
    assert [a.status_code for a in failures] == [500, 500]  # the error itself, no fallback
    refused = client.get("/payments")
    assert refused.status_code == 503
    assert refused["Content-Type"] == "application/problem+json"
    assert 29 <= int(refused["Retry-After"]) <= 30
    assert refused.json()["kind"] == "circuit_open"
    metrics = client.get("/metrics").content.decode()
    assert 'floodwall_circuit_breaker_state{resource="payments",state="open"} 1.0' in metrics
    assert 'floodwall_fallbacks_total{resource="reviews"} 3.0' in metrics
    assert 'guard="http",outcome="app_rejected",reason="circuit_open"} 1.0' in metrics


def test_django_a_repeated_write_with_one_key_runs_once(down: Path) -> None:
    client = Client()
    before = views.COUNTS.get("orders", 0)
    key = {"Idempotency-Key": "order-77"}
    first = client.post("/orders", b'{"item": "book"}', "application/json", headers=key)
    again = client.post("/orders", b'{"item": "book"}', "application/json", headers=key)
    reused = client.post("/orders", b'{"item": "pen"}', "application/json", headers=key)
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() == {"order": before + 1, "item": "book"}
    assert again["Idempotent-Replayed"] == "true" and not first.has_header("Idempotent-Replayed")
    assert reused.status_code == 422
    assert views.COUNTS["orders"] == before + 1


def test_django_async_views_run_under_the_guard_too(down: Path) -> None:
    async def scenario() -> Any:
        return await AsyncClient().get("/hello-async", headers={"X-Request-Deadline": "900"})

    answer = asyncio.run(scenario())
    assert answer.status_code == 200
    assert 0.5 < answer.json()["remaining"] <= 0.9


def test_django_floodwall_check_lists_the_resources_and_fails_on_an_invalid_config(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    call_command("floodwall_check", stdout=out)
    text = out.getvalue()
    assert text.startswith("valid: settings.FLOODWALL: 2 resource(s)")
    assert "payments:" in text and "reviews:" in text
    bad = tmp_path / "floodwall.yaml"
    bad.write_text("resources:\n  payments:\n    circuit_breaker: {failure_rate: 1.5}\n")
    with override_settings(FLOODWALL=bad), pytest.raises(CommandError) as raised:
        call_command("floodwall_check")
    assert str(bad) in str(raised.value) and "failure_rate" in str(raised.value)
    with override_settings(FLOODWALL_GUARD={"limit": []}), pytest.raises(CommandError) as typo:
        call_command("floodwall_check")
    assert "settings.FLOODWALL_GUARD: unknown option(s) ['limit']" in str(typo.value)


def test_django_an_invalid_config_is_a_system_check_error_and_stops_the_middleware() -> None:
    broken = {"resources": {"payments": {"retry": {"attempts": 0}}}}
    with override_settings(FLOODWALL=broken):
        errors = [e for e in checks.run_checks() if e.id == "floodwall.E001"]
        assert len(errors) == 1 and "settings.FLOODWALL" in errors[0].msg
        with pytest.raises(ImproperlyConfigured, match="attempts"):
            floodwall.django.guard()
        with pytest.raises(ImproperlyConfigured):
            Client().get("/hello")


def test_django_the_registry_is_the_settings(down: Path) -> None:
    registry = floodwall.django.registry()
    assert registry.names() == ["payments", "reviews"]
    assert isinstance(registry.get("payments").breaker, fw.CircuitBreaker)
    assert floodwall.django.guard().registry is registry


def test_django_a_global_limit_whose_store_is_down_answers_503_not_429(
    restartable_redis: RestartableRedis,
) -> None:
    limit = {"rate": "1/min", "algorithm": "fixed", "scope": "global", "store": "shared"}
    document = {
        "stores": {"shared": restartable_redis.url},
        "resources": {"quota": {"rate_limit": {**limit, "on_store_error": "fail_closed"}}},
    }
    client = Client(raise_request_exception=False)
    with override_settings(FLOODWALL=document, FLOODWALL_GUARD=_guard_settings()):
        floodwall.django.registry().get("quota").limiter.reset()  # type: ignore[union-attr]
        assert client.get("/quota").status_code == 200
        assert client.get("/quota").status_code == 429  # the store answers: the caller's rate
        restartable_redis.stop()
        answers = [client.get("/quota") for _ in range(2)]
        metrics = client.get("/metrics").content.decode()
    for answer in answers:
        assert answer.status_code == 503
        assert answer["Content-Type"] == "application/problem+json"
        assert 1 <= int(answer["Retry-After"]) <= 10
        assert answer.json()["kind"] == "store_unavailable"
    assert 'guard="http",outcome="app_rejected",reason="store_unavailable"} 2.0' in metrics
