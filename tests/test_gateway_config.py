"""The gateway's configuration: shape, defaults, and errors that name their path."""

from __future__ import annotations

from typing import Any

import pytest

from floodwall import ConfigError
from floodwall.gateway.config import parse_gateway, parse_gateway_text

BASE: dict[str, Any] = {
    "listen": "0.0.0.0:8080",
    "admin": {"listen": "127.0.0.1:9901", "token_env": "FLOODWALL_ADMIN_TOKEN"},
    "upstreams": {
        "product": {
            "endpoints": ["http://127.0.0.1:9001", "http://127.0.0.1:9002"],
            "balance": "least_request",
        },
        "gifts": {"endpoints": ["http://127.0.0.1:9003"]},
    },
    "resources": {"product": {"timeout": "2s"}, "gifts": {"level": 3}},
    "stores": {"default": "memory://", "redis": "redis://127.0.0.1:6379/0"},
    "routes": [
        {
            "match": {"path_prefix": "/api/product"},
            "upstream": "product",
            "resource": "product",
            "rate_limit": {
                "rate": "100/s",
                "burst": 50,
                "key": "client_ip",
                "scope": "global",
                "store": "redis",
            },
        },
        {
            "match": {"path_prefix": "/api/gifts"},
            "upstream": "gifts",
            "resource": "gifts",
            "fallback": {"status": 200, "json": {"gifts": ["rose", "star"]}},
        },
    ],
}


def _with(**changes: Any) -> dict[str, Any]:
    import copy

    doc = copy.deepcopy(BASE)
    doc.update(changes)
    return doc


def test_the_issue_example_is_valid() -> None:
    doc = parse_gateway(BASE, "gateway.yaml")
    assert doc.listen == ("0.0.0.0", 8080)  # noqa: S104
    assert doc.admin is not None and doc.admin.listen == ("127.0.0.1", 9901)
    assert doc.upstreams["product"].balance == "least_request"
    assert doc.route_names() == ["/api/product", "/api/gifts"]
    fallback = doc.routes[1].fallback
    assert fallback is not None and fallback.json_body == {"gifts": ["rose", "star"]}
    assert doc.resources["gifts"].retry is None or doc.resources["gifts"].level == 3


def test_yaml_text_with_units() -> None:
    text = """
listen: 127.0.0.1:0
upstreams: {a: {endpoints: ["http://10.0.0.1:80"], connect_timeout: 250ms}}
routes: [{match: {path: /x}, upstream: a, timeout: 2s}]
"""
    doc = parse_gateway_text(text, "gw.yaml")
    assert doc.upstreams["a"].connect_timeout == 0.25
    assert doc.routes[0].timeout == 2.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"listen": "nowhere"}, "gw.yaml: listen: expected 'host:port'"),
        (
            {"routes": [{"match": {"path_prefix": "/"}, "upstream": "gift"}]},
            "gw.yaml: routes[0].upstream: no upstream named 'gift' (known: gifts, product)",
        ),
        (
            {"routes": [{"match": {"path_prefix": "/"}, "upstream": "gifts", "resource": "x"}]},
            "routes[0].resource: no resource named 'x'",
        ),
        (
            {"routes": [{"match": {"path_prefix": "api"}, "upstream": "gifts"}]},
            "gw.yaml: routes[0].match: path_prefix must start with '/', got 'api'",
        ),
        (
            {"routes": [{"match": {"path_regex": "("}, "upstream": "gifts"}]},
            "does not compile",
        ),
        (
            {
                "routes": [
                    {
                        "match": {"path_prefix": "/"},
                        "upstream": "gifts",
                        "rate_limit": {"rate": "5/s", "key": "path:user"},
                    }
                ]
            },
            "routes[0].rate_limit.key: 'path:user' needs a match.path_regex",
        ),
        (
            {
                "routes": [
                    {
                        "match": {"path_prefix": "/"},
                        "upstream": "gifts",
                        "rate_limit": {"rate": "5/s", "algorithm": "fixed", "burst": 3},
                    }
                ]
            },
            "routes[0].rate_limit.burst: applies to gcra and token_bucket only",
        ),
        (
            {"upstreams": {"a": {"endpoints": ["ftp://x"]}}, "routes": []},
            "gw.yaml: upstreams.a.endpoints[0]: expected an http:// or https:// URL with a "
            "host, got 'ftp://x'",
        ),
        (
            {"upstreams": {"a": {"endpoints": ["http://x/path"]}}, "routes": []},
            "no path, query or user",
        ),
        ({"upstreams": {"a": {"endpoints": []}}, "routes": []}, "upstreams.a.endpoints"),
        ({"workers": 0}, "workers"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
        (
            {"routes": [{"match": {}, "upstream": "gifts", "fallback": {"headers": {}}}]},
            "a fallback needs a static answer",
        ),
    ],
)
def test_errors_name_the_path(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_gateway(_with(**change), "gw.yaml")
    assert message in str(info.value)


def test_unnamed_routes_with_the_same_path_get_unique_names() -> None:
    doc = parse_gateway(
        _with(
            routes=[
                {"match": {"path_prefix": "/x", "methods": ["POST"]}, "upstream": "gifts"},
                {"match": {"path_prefix": "/x"}, "upstream": "gifts"},
            ]
        )
    )
    assert doc.route_names() == ["/x", "/x#1"]
    with pytest.raises(ConfigError, match=r"routes\[1\]\.name: two routes are named 'same'"):
        parse_gateway(
            _with(
                routes=[
                    {"name": "same", "upstream": "gifts"},
                    {"name": "same", "upstream": "gifts"},
                ]
            )
        )


def test_resources_keep_the_library_rules() -> None:
    doc = parse_gateway(
        _with(defaults={"retry": {"attempts": 3}}, resources={"a": {"level": 3}, "b": {}})
        | {"routes": []}
    )
    assert doc.resources["a"].retry is not None and doc.resources["a"].retry.attempts == 1
    assert doc.resources["b"].retry is not None and doc.resources["b"].retry.attempts == 3


def test_every_shedding_algorithm_builds() -> None:
    from floodwall import FakeClock
    from floodwall.adaptive import AdaptiveLimiter, QueueingTimeAdmission
    from floodwall.gateway.policies import build_shedder

    for algorithm in ("gradient2", "gradient", "vegas", "aimd", "fixed", "dagor"):
        route = {"match": {}, "upstream": "gifts", "shedding": {"algorithm": algorithm, "limit": 5}}
        doc = parse_gateway(_with(routes=[route]))
        shedder = build_shedder("r", doc.routes[0], FakeClock())
        assert shedder is not None
        kind = QueueingTimeAdmission if algorithm == "dagor" else AdaptiveLimiter
        assert isinstance(shedder.limiter, kind)
    queue_only = {
        "match": {},
        "upstream": "gifts",
        "shedding": {"algorithm": None, "max_queue_time": "50ms"},
    }
    shedder = build_shedder("r", parse_gateway(_with(routes=[queue_only])).routes[0], FakeClock())
    assert shedder is not None and shedder.limiter is None


@pytest.mark.parametrize("name", ["X-Id\r\nX-Injected: 1", "X Id", "", "X-Id:"])
def test_the_request_id_header_must_be_a_field_name(name: str) -> None:
    """It is written as it is into every answer's head: CR/LF there would split the head."""
    with pytest.raises(ConfigError, match=r"proxy\.request_id_header.*not a field name"):
        parse_gateway(_with(proxy={"request_id_header": name}), "gw.yaml")
    assert parse_gateway(_with(proxy={"request_id_header": "X-Trace-Id"})).proxy is not None
