"""One name per thing: one import path per integration, one rate parser with one grammar."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import pytest

import floodwall
from floodwall import config, ratelimit

INTEGRATIONS = ("httpx", "aiohttp", "requests", "asgi", "wsgi", "grpc")


@pytest.mark.parametrize("name", INTEGRATIONS)
def test_each_integration_has_one_import_path(name: str) -> None:
    """The documented short path is the module itself; the long one does not exist."""
    assert importlib.util.find_spec(f"floodwall.{name}") is not None
    assert importlib.util.find_spec(f"floodwall.integrations.{name}") is None


@pytest.mark.parametrize("name", INTEGRATIONS)
def test_integration_exports_are_defined_where_they_are_imported(name: str) -> None:
    """Every class an integration module exports is its own or a shared framework-free part."""
    if name not in ("asgi", "wsgi"):  # these two need no framework
        pytest.importorskip(name)
    module = importlib.import_module(f"floodwall.{name}")
    for export in module.__all__:
        origin = getattr(getattr(module, export), "__module__", "")
        assert origin in (module.__name__, "floodwall.integrations._inbound"), (export, origin)


def test_config_reads_rates_with_the_limiters_parser() -> None:
    assert config.parse_rate is ratelimit.parse_rate
    assert config.parse_rate("5/h") == ratelimit.Rate(5, 3600.0)


def _public_modules() -> list[str]:
    """Every public module of the package (no part of its dotted name starts with ``_``)."""
    found = ["floodwall"]
    for info in pkgutil.walk_packages(floodwall.__path__, "floodwall."):
        parts = info.name.split(".")[1:]
        if not any(part.startswith("_") for part in parts):
            found.append(info.name)
    return found


def test_no_two_public_functions_share_a_name() -> None:
    """A function name exported twice is the same function (a facade re-export), never two
    functions with different meanings (``config.resolve`` / ``stores.resolve`` were)."""
    seen: dict[str, tuple[str, object]] = {}
    clashes = []
    for name in _public_modules():
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # an integration whose framework is not installed here
            if exc.name is None or exc.name.startswith("floodwall"):
                raise
            continue
        for export in getattr(module, "__all__", ()):
            value = getattr(module, export)
            if isinstance(value, type) or not callable(value):
                continue
            first = seen.setdefault(export, (name, value))
            if first[1] is not value:
                clashes.append(f"{export}: {first[0]} and {name}")
    assert clashes == []
