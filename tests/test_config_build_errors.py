"""Errors found while *building* a valid document name their path like schema errors do (issue
17: clear errors): ``resources.orders.rate_limit.store: …``, the constraint and the value, on a
Registry's load, on a reload (which keeps the last good document) and in ``check-config``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from floodwall import ConfigError
from floodwall.cli import FAILED, app
from floodwall.config import Registry
from floodwall.stores import connect

BAD_PORT = "redis://:secret@127.0.0.1:notaport/0"


def _limited(url: str, section: str = "rate_limit") -> dict[str, Any]:
    sections: dict[str, Any] = {
        "rate_limit": {"rate": "5/s", "algorithm": "fixed", "scope": "global", "store": "shared"},
        "idempotency": {"store": "shared"},
        "cache": {"ttl": "1s", "store": "shared"},
    }
    return {"stores": {"shared": url}, "resources": {"orders": {section: sections[section]}}}


CASES: list[tuple[dict[str, Any], str]] = [
    (
        _limited(BAD_PORT),
        r"resources\.orders\.rate_limit\.store: stores\.shared cannot be opened: store url port "
        r"must be an integer in 1-65535, got 'redis://:\*\*\*@127\.0\.0\.1:notaport/0'",
    ),
    (
        _limited("redis://127.0.0.1:99999/0", "idempotency"),
        r"resources\.orders\.idempotency\.store: stores\.shared cannot be opened: store url port "
        r"must be an integer in 1-65535, got 'redis://127\.0\.0\.1:99999/0'",
    ),
    (
        _limited("host://has space", "cache"),
        r"resources\.orders\.cache\.store: stores\.shared = 'host://has space' cannot be opened: "
        r"host store name must be .*, got 'has space'",
    ),
    (
        {"resources": {"orders": {"adaptive": {"algorithm": "aimd", "options": {"nope": 1}}}}},
        r"resources\.orders\.adaptive: options for aimd must be among .*, got \['nope'\]",
    ),
]


@pytest.mark.parametrize(("document", "message"), CASES)
def test_a_registry_names_the_path_of_a_build_error(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        Registry(document)
    assert "secret" not in str(error.value)  # a password in a URL is never shown


@pytest.mark.parametrize(("document", "message"), CASES)
def test_a_reload_names_the_path_and_keeps_the_last_good_document(
    document: dict[str, Any], message: str
) -> None:
    registry = Registry({"resources": {"orders": {"timeout": "1s"}}})
    good = registry.document
    with pytest.raises(ConfigError, match=message):
        registry.reload(document, "next.yaml")
    assert registry.document is good
    assert registry.get("orders").timeout is not None


def test_check_config_names_the_file_and_the_path(tmp_path: Path) -> None:
    path = tmp_path / "floodwall.yaml"
    path.write_text(
        "stores: {shared: 'redis://127.0.0.1:notaport/0'}\n"
        "resources:\n"
        "  orders:\n"
        "    rate_limit: {rate: 5/s, algorithm: fixed, scope: global, store: shared}\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, ["check-config", str(path)])
    output = "".join(result.output.split())  # rich wraps anywhere, even inside a path
    assert result.exit_code == FAILED
    assert f"invalid:{path}:resources.orders.rate_limit.store:stores.sharedcannotbe" in output
    assert "portmustbeanintegerin1-65535" in output
    assert "valid:" not in output.replace("invalid:", "")


def test_a_port_no_socket_can_use_is_refused_when_the_store_is_made() -> None:
    for url in ("redis://127.0.0.1:0/0", "postgresql://u@db:70000/x", "rediss://h:port/0"):
        with pytest.raises(ConfigError, match=re.escape("port must be an integer in 1-65535")):
            connect(url)
    for url in ("redis://localhost/0", "postgresql://u@h1:5432,h2:5433/x", "redis://[::1]:6379"):
        connect(url)  # no port, several hosts, IPv6: fine (nothing connects yet)


def test_check_config_builds_a_gateways_route_limits(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "stores: {shared: 'redis://127.0.0.1:notaport/0'}\n"
        "upstreams: {svc: {endpoints: ['http://127.0.0.1:9']}}\n"
        "routes:\n"
        "  - name: quota\n"
        "    match: {path_prefix: /}\n"
        "    upstream: svc\n"
        "    rate_limit: {rate: 5/s, algorithm: fixed, scope: global, store: shared}\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, ["check-config", str(path)])
    output = "".join(result.output.split())
    assert result.exit_code == FAILED
    assert f"invalid:{path}:routes[0](quota):rate_limit.store:stores.sharedcannotbe" in output
    assert "portmustbeanintegerin1-65535" in output


@pytest.mark.parametrize(
    "url", ["redis+cluster://127.0.0.1:99999", "rediss+cluster://127.0.0.1:0", "redis://h:x/0"]
)
def test_a_server_url_whose_port_no_socket_can_use_is_refused_at_connect(url: str) -> None:
    from floodwall.stores import connect

    with pytest.raises(ConfigError, match="must be an integer in 1-65535"):
        connect(url)
