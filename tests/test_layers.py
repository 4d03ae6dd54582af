"""The layer contract: every module of the library imports only the layers above its own.

The map (docs/architecture.md), top to bottom: core, policies, stores, shared state, config,
observe, integrations, applications. A module's layer is named below by module prefix, the
longest prefix winning. A package's ``__init__`` only re-exports, so it sits at the layer of
the deepest module it imports: importing ``floodwall.ratelimit`` (which re-exports the global
limiters) from a local policy is therefore an arrow the wrong way, while a policy importing
``floodwall.ratelimit._base`` is not. The root ``floodwall/__init__.py`` is the public facade
of everything and is not checked.

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
    ("core", ("floodwall._core", "floodwall.context", "floodwall.classify")),
    (
        "policies",
        (
            "floodwall.breaker",
            "floodwall.bulkhead",
            "floodwall.retry",
            "floodwall.backoff",
            "floodwall.budget",
            "floodwall.hedge",
            "floodwall.timeout",
            "floodwall.fallback",
            "floodwall.pipeline",
            "floodwall.chaos",
            "floodwall.ratelimit",
            "floodwall.adaptive",
            "floodwall.degrade",
        ),
    ),
    ("stores", ("floodwall.stores",)),
    (
        "shared state",
        (
            "floodwall.frequency",
            "floodwall.idempotency",
            "floodwall.ratelimit.global_limit",
            "floodwall.ratelimit.leasing",
            "floodwall.ratelimit.timeslice",
            "floodwall.ratelimit._global_ops",
            "floodwall.ratelimit._coalesce",
            "floodwall.degrade.cache",
            "floodwall.degrade.write_behind",
        ),
    ),
    ("config", ("floodwall.config",)),
    ("observe", ("floodwall.observe",)),
    (
        "integrations",
        (
            "floodwall.integrations",
            "floodwall.httpx",
            "floodwall.aiohttp",
            "floodwall.requests",
            "floodwall.grpc",
            "floodwall.asgi",
            "floodwall.wsgi",
            "floodwall.celery",
            "floodwall.dramatiq",
            "floodwall.arq",
            "floodwall.django",
            "floodwall.testing",
        ),
    ),
    (
        "applications",
        (
            "floodwall.gateway",
            "floodwall.drill",
            "floodwall.sim",
            "floodwall.cli",
            "floodwall.__main__",
        ),
    ),
)
NAMES = [name for name, _ in LAYERS]


def declared_layer(module: str) -> int | None:
    """The layer a module's name puts it in (longest matching prefix), or None."""
    best, length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = index, len(prefix)
    return best


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


class Map:
    """Layers of the real modules, with each package facade at its deepest import's layer."""

    def __init__(self, sources: dict[str, tuple[str, bool]]) -> None:
        self.sources = sources
        self._facades: dict[str, int | None] = {}

    def package_of(self, name: str) -> str:
        return name if self.sources[name][1] else name.rpartition(".")[0]

    def resolve(self, module: str) -> str | None:
        """The real module behind an imported name (``from pkg import name``: pkg or pkg.name)."""
        while module not in self.sources and "." in module:
            module = module.rpartition(".")[0]
        return module if module in self.sources else None

    def layer(self, module: str) -> int | None:
        resolved = self.resolve(module)
        if resolved is None:
            return None
        module = resolved
        source, init = self.sources[module]
        if not init or module == "floodwall":
            return declared_layer(module)
        if module not in self._facades:
            self._facades[module] = declared_layer(module)  # guards against import cycles
            deepest = [
                self.layer(target)
                for target, _ in imports_of(source, module)
                if target.startswith("floodwall") and target != module
            ]
            known = [d for d in deepest if d is not None]
            self._facades[module] = max([declared_layer(module) or 0, *known])
        return self._facades[module]

    def violations(self) -> list[str]:
        found = []
        for name, (source, init) in sorted(self.sources.items()):
            if name == "floodwall":
                continue
            mine = declared_layer(name) if not init else None
            if mine is None:
                mine = self.layer(name) if init else None
            if mine is None:
                found.append(f"{name}: in no layer (add it to tests/test_layers.py)")
                continue
            for target, line in imports_of(source, self.package_of(name)):
                if not target.startswith("floodwall.") or init:
                    continue
                theirs = self.layer(target)
                if theirs is not None and theirs > mine:
                    real = self.resolve(target)
                    found.append(f"{name}:{line} ({NAMES[mine]}) imports {real} ({NAMES[theirs]})")
        return sorted(set(found))


def real_map() -> Map:
    return Map({name: (path.read_text(), init) for name, (path, init) in modules().items()})


def test_every_import_points_up_the_layers() -> None:
    violations = real_map().violations()
    assert violations == [], "imports against the layer map:\n" + "\n".join(violations)


def test_a_wrong_import_is_caught() -> None:
    """The check is live: a policy importing the gateway, or a facade of a lower layer, fails."""
    sources = {name: (path.read_text(), init) for name, (path, init) in modules().items()}
    breaker, init = sources["floodwall.breaker"]
    sources["floodwall.breaker"] = (breaker + "\nfrom floodwall.gateway import config\n", init)
    sources["floodwall.fallback"] = (
        sources["floodwall.fallback"][0] + "\nimport floodwall.ratelimit\n",
        False,
    )
    violations = Map(sources).violations()
    assert any(v.startswith("floodwall.breaker:") and "applications" in v for v in violations)
    assert any(
        v.startswith("floodwall.fallback:") and "floodwall.ratelimit (shared state)" in v
        for v in violations
    )


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("floodwall._core.drivers", "core"),
        ("floodwall.breaker", "policies"),
        ("floodwall.ratelimit.token", "policies"),
        ("floodwall.ratelimit.global_limit", "shared state"),
        ("floodwall.stores.redis", "stores"),
        ("floodwall.gateway.proxy", "applications"),
    ],
)
def test_modules_sit_where_the_map_says(module: str, layer: str) -> None:
    assert NAMES[declared_layer(module) or 0] == layer
