"""``rate_limit: {scope: global}`` in a resource: one limit shared by every process, on Redis."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from floodwall import ConfigError, RateLimitedError
from floodwall.config import Registry
from floodwall.shared.global_limit import GlobalLimiter

pytestmark = pytest.mark.integration


def _document(redis_url: str, name: str, **rate_limit: Any) -> dict[str, Any]:
    section = {"rate": "5/min", "algorithm": "fixed", "scope": "global", "store": "shared"}
    return {
        "stores": {"shared": redis_url},
        "resources": {name: {"rate_limit": {**section, **rate_limit}}},
    }


def test_two_registries_share_one_limit_through_redis(redis_url: str) -> None:
    name = f"partner-{uuid.uuid4().hex[:8]}"  # fresh keys on the session's Redis
    first = Registry(_document(redis_url, name))
    second = Registry(_document(redis_url, name))  # another process, as far as Redis knows
    try:
        limiter = first.get(name).limiter
        assert isinstance(limiter, GlobalLimiter)
        admitted = rejected = 0
        for n in range(12):
            registry = first if n % 2 else second
            try:
                registry.get(name).call(lambda: "ok")
                admitted += 1
            except RateLimitedError:
                rejected += 1
        assert (admitted, rejected) == (5, 7)  # 5 per minute across both, not 5 each
        assert first.snapshot()[name]["rate_limit"] == {
            "scope": "global",
            "store": "up",
            "rejected": limiter.rejected,
        }
        assert limiter.rejected >= 1
    finally:
        first.close()
        second.close()


def test_store_down_falls_back_to_the_local_share(unused_tcp_port: int) -> None:
    name = f"down-{uuid.uuid4().hex[:8]}"
    doc = _document(
        f"redis://127.0.0.1:{unused_tcp_port}/0",
        name,
        rate="4/min",
        expected_instances=2,
        on_store_error="local",
    )
    registry = Registry(doc)
    try:
        resource = registry.get(name)
        outcomes = []
        for _ in range(4):
            try:
                outcomes.append(resource.call(lambda: "ok"))
            except RateLimitedError:
                outcomes.append("limited")
        assert outcomes == ["ok", "ok", "limited", "limited"]  # 4 ÷ 2 instances, no exception
        limiter = resource.limiter
        assert isinstance(limiter, GlobalLimiter)
        assert limiter.guard.state == "down"
    finally:
        registry.close()


@pytest.mark.parametrize("algorithm", ["leaky", "sliding_log"])
def test_an_algorithm_with_no_global_form_is_refused_by_name(
    redis_url: str, algorithm: str
) -> None:
    with pytest.raises(
        Exception,
        match=rf"resources\.x\.rate_limit.*algorithm '{algorithm}' has no shared form",
    ):
        Registry(_document(redis_url, "x", algorithm=algorithm))


def test_an_unknown_store_is_refused_by_name(redis_url: str) -> None:
    doc = _document(redis_url, "y", store="nowhere")
    with pytest.raises(ConfigError, match=r"no store named 'nowhere'"):
        Registry(doc)
