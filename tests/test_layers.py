"""The layer contract: every module of the library imports only the layers above its own.

The map (docs/architecture.md), top to bottom: core, policies, stores, shared state, config,
observe, integrations, applications. Each layer is a list of whole top-level packages and
modules of ``floodwall``; a module sits in the layer of its top-level package, with no
exception for a single module. A package's ``__init__`` is checked like any other module, so a
policy package re-exporting a store-backed class is an arrow the wrong way. The root
``floodwall/__init__.py`` is the public facade of everything and is not checked.

Imports under ``if TYPE_CHECKING:`` count too: a type-only arrow the wrong way is still a
dependency a reader has to follow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("_core", "context", "classify")),
    (
        "policies",
        (
            "breaker",
            "bulkhead",
            "retry",
            "backoff",
            "budget",
            "hedge",
            "timeout",
            "fallback",
            "pipeline",
            "chaos",
            "ratelimit",
            "adaptive",
            "degrade",
        ),
    ),
    ("stores", ("stores",)),
    ("shared state", ("shared",)),
    ("config", ("config",)),
    ("observe", ("observe",)),
    (
        "integrations",
        (
            "integrations",
            "httpx",
            "aiohttp",
            "requests",
            "grpc",
            "asgi",
            "wsgi",
            "celery",
            "dramatiq",
            "arq",
            "django",
            "testing",
        ),
    ),
    ("applications", ("gateway", "drill", "sim", "cli", "__main__")),
)
NAMES = [name for name, _ in LAYERS]
TOP = {top: index for index, (_, tops) in enumerate(LAYERS) for top in tops}
"""``floodwall.<top>`` -> its layer's index."""


def declared_layer(module: str) -> int | None:
    """The layer of a ``floodwall.<top>[...]`` module: its top-level package's, or None."""
    parts = module.split(".")
    if parts[0] != "floodwall" or len(parts) < 2:
        return None
    return TOP.get(parts[1])


def imports_of(source: str, package: str) -> Iterator[tuple[str, int]]:
    """``(module, line)`` for every floodwall module the source imports (relative ones
    resolved against ``package``)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            yield module, node.lineno
            for alias in node.names:  # ``from floodwall.x import submodule``
                yield f"{module}.{alias.name}", node.lineno


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module under src/floodwall: name -> (path, is a package's __init__)."""
    found = {}
    for path in sorted((SRC / "floodwall").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        init = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if init else parts)
        found[name] = (path, init)
    return found


def violations(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """Every import that runs against the map, as ``module:line (layer) imports target``."""
    found = []
    for name, (source, init) in sorted(sources.items()):
        if name == "floodwall":
            continue
        mine = declared_layer(name)
        if mine is None:
            found.append(f"{name}: in no layer (add its package to tests/test_layers.py)")
            continue
        package = name if init else name.rpartition(".")[0]
        for target, line in imports_of(source, package):
            theirs = declared_layer(target)
            if theirs is not None and theirs > mine:
                found.append(f"{name}:{line} ({NAMES[mine]}) imports {target} ({NAMES[theirs]})")
    return sorted(set(found))


def real_sources() -> dict[str, tuple[str, bool]]:
    return {name: (path.read_text(), init) for name, (path, init) in modules().items()}


def test_every_import_points_up_the_layers() -> None:
    found = violations(real_sources())
    assert found == [], "imports against the layer map:\n" + "\n".join(found)


def test_a_wrong_import_is_caught() -> None:
    """The check is live: a policy importing the gateway, or a policy package's facade
    re-exporting a store-backed class, fails."""
    sources = real_sources()
    breaker, init = sources["floodwall.breaker"]
    sources["floodwall.breaker"] = (breaker + "\nfrom floodwall.gateway import config\n", init)
    facade, init = sources["floodwall.ratelimit"]
    sources["floodwall.ratelimit"] = (
        facade + "\nfrom floodwall.shared.global_limit import GlobalLimiter\n",
        init,
    )
    found = violations(sources)
    assert any(v.startswith("floodwall.breaker:") and "(applications)" in v for v in found)
    assert any(
        v.startswith("floodwall.ratelimit:") and "floodwall.shared.global_limit (shared state)" in v
        for v in found
    )


def test_every_top_level_name_is_mapped_once() -> None:
    tops = [top for _, names in LAYERS for top in names]
    assert len(tops) == len(set(tops))
    on_disk = {
        path.stem if path.is_file() else path.name
        for path in (SRC / "floodwall").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    }
    assert on_disk == set(tops)


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("floodwall._core.drivers", "core"),
        ("floodwall.breaker", "policies"),
        ("floodwall.ratelimit", "policies"),
        ("floodwall.ratelimit.token", "policies"),
        ("floodwall.stores.redis", "stores"),
        ("floodwall.shared", "shared state"),
        ("floodwall.shared.global_limit", "shared state"),
        ("floodwall.shared.cache", "shared state"),
        ("floodwall.gateway.proxy", "applications"),
    ],
)
def test_modules_sit_where_the_map_says(module: str, layer: str) -> None:
    assert NAMES[declared_layer(module) or 0] == layer
